"""Asynchronous calls' state in JetStream, shared by the platform and the replicas.

Each call has two keys in the ``ember_calls`` KV bucket: ``s.<id>``, its status while it waits or runs,
and ``r.<id>``, its final record. The final record is written with ``create`` (only if absent), so the
first writer wins: a late duplicate of a redelivered call, or a cancel racing a finish, can never
overwrite or duplicate a result. Outputs too large for a KV entry go to the ``ember_results`` object
store and the record points there.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError, NotFoundError

from ember.wire import CallRecord, CallStatus, DeadLetter, ErrorInfo, encoder, subjects
from ember.wire.jetstream import Stores

MAX_INLINE_OUTPUT = 256 * 1024
_record_decoder = msgspec.json.Decoder(CallRecord)
_LARGE = b'{"$ember_result":"object"}'


class CallStore:
    def __init__(self, js: Any, stores: Stores) -> None:
        self._js = js
        self._kv = stores.calls
        self._results = stores.results

    async def create_status(self, record: CallRecord) -> CallRecord | None:
        """Record a new call as queued; returns the existing record instead when the id is taken."""
        try:
            await self._kv.create(f"s.{record.call_id}", encoder.encode(record))
            return None
        except KeyWrongLastSequenceError:
            return await self.get(record.call_id)

    async def set_status(self, record: CallRecord) -> None:
        await self._kv.put(f"s.{record.call_id}", encoder.encode(record))

    async def finish(self, record: CallRecord) -> bool:
        """Store a final record; False when one was already stored (the first writer won)."""
        output = bytes(record.output)
        if len(output) > MAX_INLINE_OUTPUT:
            await self._results.put(record.call_id, output)
            record = msgspec.structs.replace(record, output=msgspec.Raw(_LARGE))
        try:
            await self._kv.create(f"r.{record.call_id}", encoder.encode(record))
        except KeyWrongLastSequenceError:
            return False
        return True

    async def result(self, call_id: str) -> CallRecord | None:
        record = await self._read(f"r.{call_id}")
        if record is not None and bytes(record.output) == _LARGE:
            data = (await self._results.get(call_id)).data or b"null"
            record = msgspec.structs.replace(record, output=msgspec.Raw(data))
        return record

    async def get(self, call_id: str) -> CallRecord | None:
        """The call's final record if it has one, else its status; None for an unknown id."""
        return await self.result(call_id) or await self._read(f"s.{call_id}")

    async def status(self, call_id: str) -> CallRecord | None:
        """The call's status record alone (one read; the final record may exist beside it)."""
        return await self._read(f"s.{call_id}")

    async def has_result(self, call_id: str) -> bool:
        return await self._read(f"r.{call_id}") is not None

    async def _read(self, key: str) -> CallRecord | None:
        try:
            entry = await self._kv.get(key)
        except (KeyNotFoundError, NotFoundError, NoKeysError):
            return None
        return _record_decoder.decode(entry.value) if entry.value else None

    async def dead_letter(self, record: CallRecord, error: ErrorInfo, body: bytes) -> None:
        """Keep a call that failed its last attempt, with its input, in the dead-letter stream."""
        letter = DeadLetter(call_id=record.call_id, app=record.app, function=record.function, error=error,
                            attempts=record.attempts, dead_at=time.time(), input=msgspec.Raw(body or b"null"))
        await self._js.publish(subjects.dead(record.app, record.function), encoder.encode(letter),
                               headers={"Nats-Msg-Id": f"dead-{record.call_id}"})


def final(record: CallRecord, status: CallStatus, *, output: bytes = b"null", error: ErrorInfo | None = None,
          attempts: int | None = None) -> CallRecord:
    return msgspec.structs.replace(record, status=status, output=msgspec.Raw(output), error=error,
                                   updated_at=time.time(),
                                   attempts=record.attempts if attempts is None else attempts)
