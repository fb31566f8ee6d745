"""Answers to synchronous calls, replica to gateway, in frames (see ``ember.wire.frames``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from ember._errors import EmberError, RemoteError
from ember.wire import Answer, Outbox, encode_output, encoder, error_info, split_frames

log = logging.getLogger("ember.replica")
ACK_DELAY_S = 0.01  # calls answered sooner are never acked


def answer_of(call_id: str, output: Any, error: EmberError | None, batch_size: int) -> Answer:
    """The answer to one call: its output as JSON, or its error (an output that is not JSON-able is one)."""
    if error is None:
        try:
            return Answer(call_id=call_id, output=msgspec.Raw(encode_output(output)), batch_size=batch_size)
        except RemoteError as exc:
            error = exc
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
        self._held: dict[str, str] = {}  # call id -> reply inbox, for calls not answered yet
        self._sweep: asyncio.TimerHandle | None = None
        self._outbox: Outbox[str, Answer] = Outbox(self._publish)  # reply inbox -> answers of this turn

    def hold(self, reply: str, call_id: str) -> None:
        self._held[call_id] = reply
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(ACK_DELAY_S, self._ack_held)

    def answer(self, reply: str, answer: Answer) -> None:
        self._held.pop(answer.call_id, None)
        if reply:  # a frame sent without a reply inbox wants no answers
            self._outbox.put(reply, answer)

    def _ack_held(self) -> None:
        self._sweep = None
        held, self._held = self._held, {}
        for call_id, reply in held.items():
            if reply:
                self._outbox.put(reply, Answer(call_id=call_id, ack=self._replica_id))

    async def _publish(self, outbox: dict[str, list[Answer]]) -> None:
        limit = self._nc.max_payload
        for reply, answers in outbox.items():
            sizes = [len(a.output) + (len(a.error.message) if a.error else 0) for a in answers]
            for frame in split_frames(answers, sizes, limit):
                data = encoder.encode(frame)
                if len(data) > limit:  # one answer alone: its output is too large for a NATS message
                    (answer,) = frame
                    error = RemoteError(f"the output ({len(answer.output)} bytes) is over the {limit}-byte "
                                        "limit of a NATS message", remote_type="ValueError")
                    data = encoder.encode([answer_of(answer.call_id, None, error, answer.batch_size)])
                try:
                    await self._nc.publish(reply, data)
                except Exception as exc:  # the gateway resends calls that get no answer
                    log.warning("could not send %d answers to %s: %s", len(frame), reply, exc)

    async def drain(self) -> None:
        """Send what is queued now (before the connection drains)."""
        await self._outbox.drain()
