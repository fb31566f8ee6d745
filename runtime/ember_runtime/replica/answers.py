"""Answers to synchronous calls, replica to gateway, in frames (see ``ember.wire.frames``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from ember._errors import EmberError, RemoteError
from ember.wire import Answer, Outbox, encode_output, encoder, error_info, packed_encoder, split_frames

log = logging.getLogger("ember.replica")
ACK_DELAY_S = 0.01  # calls answered sooner are never acked
_NIL = msgspec.Raw(b"\xc0")


def answer_of(call_id: str, output: Any, error: EmberError | None, batch_size: int, codec: str = "json",
              compact: bool = False) -> Answer:
    """The answer to one call: its output as JSON (or msgpack, for a msgpack frame; arrays as compact tensors with
    ``compact``), or its error (an output that is not JSON-able is one, as is any output that fails to encode)."""
    if error is None:
        try:
            return Answer(call_id=call_id, output=msgspec.Raw(encode_output(output, codec, compact)),
                          batch_size=batch_size)
        except RemoteError as exc:
            error = exc
        except Exception as exc:  # the output's own failing (a ``tolist`` that raises, say): this call's error alone
            error = RemoteError(f"the output cannot be encoded: {type(exc).__name__}: {exc}",
                                remote_type="InvalidOutput")
    return Answer(call_id=call_id, error=error_info(error, call_id), batch_size=batch_size)


class Answers:
    """Answers to synchronous calls, sent in frames: one message per gateway inbox and turn of the event loop
    holds every answer due there (a batch's answers come out together), so a batch of N calls costs one
    message back rather than N.

    It also acks, naming this replica, the calls still unanswered at the next sweep (sweeps run
    ``ACK_DELAY_S`` apart while calls are held). The gateway needs the holder only to resend a call whose
    replica died and to cancel a call whose client went away; a call answered sooner is never acked.
    """

    def __init__(self, nc: Any, replica_id: str) -> None:
        self._nc = nc
        self._replica_id = replica_id
        self._held: dict[str, tuple[str, bool]] = {}  # call id -> reply inbox and codec, for calls not answered yet
        self._sweep: asyncio.TimerHandle | None = None
        # (reply inbox, msgpack?) -> answers of this turn: answers go back in the codec of the frame they answer
        self._outbox: Outbox[tuple[str, bool], Answer] = Outbox(self._publish)

    def hold(self, reply: str, call_id: str, packed: bool = False) -> None:
        self._held[call_id] = reply, packed
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(ACK_DELAY_S, self._ack_held)

    def answer(self, reply: str, answer: Answer, packed: bool = False) -> None:
        """Send ``answer`` (its output encoded as JSON, or as msgpack when ``packed``) to ``reply``."""
        self._held.pop(answer.call_id, None)
        if reply:  # a frame sent without a reply inbox wants no answers
            self._outbox.put((reply, packed), answer)

    def _ack_held(self) -> None:
        self._sweep = None
        held, self._held = self._held, {}
        for call_id, (reply, packed) in held.items():
            if reply:
                self._outbox.put((reply, packed), Answer(call_id=call_id, ack=self._replica_id))

    async def _publish(self, outbox: dict[tuple[str, bool], list[Answer]]) -> None:
        limit = self._nc.max_payload
        for (reply, packed), answers in outbox.items():
            codec = packed_encoder if packed else encoder
            if packed:  # an ack's or an error's output is JSON's null by default: msgpack's nil here
                answers = [msgspec.structs.replace(a, output=_NIL) if _is_null(a.output) else a for a in answers]
            sizes = [len(a.output) + (len(a.error.message) if a.error else 0) for a in answers]
            for frame in split_frames(answers, sizes, limit):
                data = codec.encode(frame)
                if len(data) > limit:  # one answer alone: its output is too large for a NATS message
                    (answer,) = frame
                    error = RemoteError(f"the output ({len(answer.output)} bytes) is over the {limit}-byte "
                                        "limit of a NATS message", remote_type="ValueError")
                    refusal = answer_of(answer.call_id, None, error, answer.batch_size)
                    data = codec.encode([msgspec.structs.replace(refusal, output=_NIL) if packed else refusal])
                try:
                    await self._nc.publish(reply, data)
                except Exception as exc:  # the gateway resends calls that get no answer
                    log.warning("could not send %d answers to %s: %s", len(frame), reply, exc)

    async def drain(self) -> None:
        """Send what is queued now (before the connection drains)."""
        await self._outbox.drain()


def _is_null(output: msgspec.Raw) -> bool:
    return len(output) == 4 and bytes(output) == b"null"
