"""A replica's reads of its own app's queued calls, asked of a control plane over the relay.

A replica writes its calls' statuses and final records itself (``$KV.ember_calls.{s,r}.<app>.>``, its own app's
keys), but reads none: a JetStream read is answered on the reply subject its request names, and NATS checks no
permission on a reply subject. A direct get of a value the replica wrote, answered to a key of another bucket
(``$KV.ember_tokens.<id>``, ``$KV.ember_deployments.<app>``), would be stored there by the server. So its queue
worker's reads (``status``, ``has_result``, ``result``) go to a control plane (``RelayCallRead``), which reads the
caller's own app's keys alone and answers into the replica's own inbox.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from nats.js.kv import KeyValue

from ember.wire.calls import CallRecord
from ember.wire.callstore import CallStore
from ember.wire.errors import error_from_info
from ember.wire.relay import RelayCallRead, RelayCallTake, TakeReply
from ember_runtime.replica.calling import NatsRelay

READ_WAIT_S = 10.0  # for a control plane's answer to one read
_record_decoder = msgspec.json.Decoder(CallRecord | None)
_take_decoder = msgspec.json.Decoder(TakeReply)


class RelayedCallStore(CallStore):
    """``CallStore`` whose reads go through the relay; its writes are the replica's own, as before."""

    def __init__(self, js: Any, calls: KeyValue, results: KeyValue, relay: NatsRelay) -> None:
        super().__init__(js, calls, results)
        self._relay = relay

    async def status(self, app: str, call_id: str) -> CallRecord | None:
        return await self._read_via_relay("s", call_id)

    async def result(self, app: str, call_id: str, *, output: bool = True) -> CallRecord | None:
        return await self._read_via_relay("r", call_id, output)

    async def has_result(self, app: str, call_id: str) -> bool:
        return await self._read_via_relay("r", call_id, output=False) is not None

    async def take(self, app: str, call_id: str, function: str, attempt: int,
                   replica: str) -> tuple[CallRecord, bool]:
        """``CallStore.take`` done by a control plane, for this replica (its relay subject names it)."""
        reply = await self._relay.request(RelayCallTake(call_id=call_id, function=function, attempt=attempt),
                                          READ_WAIT_S)
        if reply.error is not None:
            raise error_from_info(reply.error)
        taken = _take_decoder.decode(reply.output)
        return taken.record, taken.finished

    async def _read_via_relay(self, kind: Literal["s", "r"], call_id: str, output: bool = True) -> CallRecord | None:
        reply = await self._relay.request(RelayCallRead(call_id=call_id, kind=kind, output=output), READ_WAIT_S)
        if reply.error is not None:  # the worker leaves the message unacknowledged: it comes again
            raise error_from_info(reply.error)
        return _record_decoder.decode(reply.output)
