"""Answers to synchronous calls, replica to gateway, in frames (see ``ember.wire.frames``).

Every call gets an answer that fits a NATS message: a frame is cut by its answers' encoded sizes, and cut in halves
again should it still come out too large; an answer too large alone is answered with the error saying so. An
error's message is cut at ``MAX_ERROR_MESSAGE_BYTES`` (and says so), so that any error fits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import msgspec

from ember._errors import EmberError, RemoteError
from ember.wire import Answer, ErrorInfo, Outbox, encode_output, encoder, error_info, packed_encoder, split_frames
from ember.wire.tensors import TensorMeta, conform

log = logging.getLogger("ember.replica")
ACK_DELAY_S = 0.01  # calls answered sooner are never acked
_NIL = msgspec.Raw(b"\xc0")
MAX_ERROR_MESSAGE_BYTES = 64 * 1024  # an error's message is cut beyond (a traceback in it, say)


def answer_of(call_id: str, output: Any, error: EmberError | None, batch_size: int, codec: str = "json",
              compact: bool | TensorMeta = False) -> Answer:
    """The answer to one call: its output as JSON (or msgpack, for a msgpack frame; arrays as compact tensors with
    ``compact``, as its declared output where ``compact`` is one: ``tensors.conform``), or its error (an output that
    is not JSON-able is one, as is any output that fails to encode)."""
    if error is None:
        try:
            if isinstance(compact, TensorMeta):
                output = conform(output, compact)
            return Answer(call_id=call_id, output=msgspec.Raw(encode_output(output, codec, bool(compact))),
                          batch_size=batch_size)
        except RemoteError as exc:
            error = exc
        except Exception as exc:  # the output's own failing (a ``tolist`` that raises, say): this call's error alone
            error = RemoteError(f"the output cannot be encoded: {type(exc).__name__}: {exc}",
                                remote_type="InvalidOutput")
    return Answer(call_id=call_id, error=_capped(error_info(error, call_id)), batch_size=batch_size)


def _capped(info: ErrorInfo) -> ErrorInfo:
    """``info`` with its message cut at ``MAX_ERROR_MESSAGE_BYTES`` of UTF-8, saying so."""
    encoded = info.message.encode(errors="replace")
    if len(encoded) <= MAX_ERROR_MESSAGE_BYTES:
        return info
    kept = encoded[:MAX_ERROR_MESSAGE_BYTES].decode(errors="ignore")  # never half a character
    return msgspec.structs.replace(info, message=f"{kept} [cut: {len(encoded)} bytes in all]")


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
            for frame, data in _frames(answers, codec, limit, packed):
                try:
                    await self._nc.publish(reply, data)
                except Exception as exc:  # the gateway resends calls that get no answer
                    log.warning("could not send %d answers to %s: %s", len(frame), reply, exc)

    async def drain(self) -> None:
        """Send what is queued now (before the connection drains)."""
        await self._outbox.drain()


def _is_null(output: msgspec.Raw) -> bool:
    return len(output) == 4 and bytes(output) == b"null"


def _frames(answers: list[Answer], codec: Any, limit: int, packed: bool) -> Iterator[tuple[list[Answer], bytes]]:
    """``answers`` in order, encoded in frames of at most ``limit`` bytes (see the module's docstring)."""
    pending = split_frames(answers, [_size(a) for a in answers], limit)
    while pending:
        frame = pending.pop(0)
        data = codec.encode(frame)
        if len(data) <= limit:
            yield frame, data
        elif len(frame) > 1:  # the sizes fell short (escapes in JSON, say): in halves, each again
            pending[:0] = [frame[:len(frame) // 2], frame[len(frame) // 2:]]
        else:
            yield frame, codec.encode([_too_large(frame[0], len(data), limit, packed)])


def _size(answer: Answer) -> int:
    """The bytes ``answer`` takes in a frame, but for the fields every answer has (``FRAME_ITEM_OVERHEAD_BYTES``)."""
    error = answer.error
    return len(answer.output) + (len(error.message.encode(errors="replace")) if error is not None else 0)


def _too_large(answer: Answer, size: int, limit: int, packed: bool) -> Answer:
    """The answer that tells the caller ``answer`` (``size`` bytes encoded) is too large for a NATS message."""
    what = f"the output ({len(answer.output)} bytes)" if answer.error is None else f"the error ({size} bytes)"
    error = RemoteError(f"{what} is over the {limit}-byte limit of a NATS message", remote_type="ValueError")
    refusal = answer_of(answer.call_id, None, error, answer.batch_size)
    return msgspec.structs.replace(refusal, output=_NIL) if packed else refusal


def declared_output(served: Any) -> bool | TensorMeta:
    """For a call that asks for compact tensors (an Open Inference Protocol call): its function's declared output,
    where it declares one (``served``: the replica's (endpoint, batcher) of the function, or None)."""
    tensors = served[0].spec.tensors if served is not None else None
    return tensors.outputs[0] if tensors is not None and tensors.outputs else True
