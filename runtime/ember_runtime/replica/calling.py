"""Calls a replica's code makes to other functions: over its own NATS connection to a control plane (see
``ember_platform.gateway.relay``), never over HTTP; and the call each batch serves, which they carry along."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Callable
from typing import Any

import msgspec
from nats.errors import ConnectionClosedError, MaxPayloadError, NoRespondersError
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeout

from ember import _inner
from ember import _tracing as tracing
from ember._errors import DeadlineExceededError, EmberError, PayloadTooLargeError, UnavailableError
from ember.wire import encoder, subjects
from ember.wire.calls import Hop
from ember.wire.relay import RelayReply, RelayRequest, reply_decoder
from ember_runtime.batching.batcher import Call


class NatsRelay:
    """The replica's side of the relay: requests on ``ember.relay.<replica id>``, answers in its own inbox."""

    def __init__(self, nc: Any, replica_id: str) -> None:
        self.loop = asyncio.get_running_loop()
        self._nc = nc
        self._subject = subjects.relay(replica_id)

    async def request(self, request: RelayRequest, wait_s: float) -> RelayReply:
        """Send ``request`` and return the control plane's answer; transport failures become Ember's errors."""
        try:
            # Traced, the call carries the caller's span on (its ``ember.run``: this runs in the caller's context).
            headers = tracing.current_headers() or None if tracing.ON else None
            msg = await self._nc.request(self._subject, encoder.encode(request), timeout=wait_s + _inner.REPLY_MARGIN_S,
                                         headers=headers)
        except NoRespondersError as exc:
            raise UnavailableError("no control plane answers calls between functions right now",
                                   retry_after_s=1.0) from exc
        except NatsTimeout as exc:
            raise DeadlineExceededError(f"no answer from the control plane within {wait_s:g}s") from exc
        except MaxPayloadError as exc:
            raise PayloadTooLargeError("the call's input is over the size of a NATS message") from exc
        except (ConnectionClosedError, NatsError, OSError) as exc:
            raise UnavailableError(f"the replica's connection to the platform failed: {exc}",
                                   retry_after_s=1.0) from exc
        try:
            return reply_decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            raise EmberError(f"an undecodable answer from the control plane: {exc}") from exc


def serving(app: str, function: str) -> Callable[[list[Call]], contextlib.AbstractContextManager[None]]:
    """For a function's batcher: the call a batch serves, for ``ember.current_call()`` and the calls it makes.

    A batch of several calls serves them all: its deadline is the latest of theirs (no caller gets more time than
    it has, and a call made for the batch may be needed until the last one's deadline), its chain every call's, and
    the calls it makes name every call it serves (a call made for the batch ends only once all of them are cancelled).
    """
    return lambda batch: _inner.serving(batch_context(app, function, batch))


def batch_context(app: str, function: str, batch: list[Call]) -> _inner.CallContext:
    chain: list[Hop] = []
    for call in batch:
        chain.extend(hop for hop in call.chain if hop not in chain)
    deadline = max((c.deadline for c in batch), default=math.inf)
    halt = batch[0].run.halt if batch and batch[0].run is not None else threading.Event()
    return _inner.CallContext(app=app, function=function, call_id=batch[0].call_id if batch else "", cancelled=halt,
                              deadline=deadline, chain=tuple(chain), call_ids=tuple(c.call_id for c in batch))
