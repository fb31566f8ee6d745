"""What the schedule loop writes at a tick, together: the ticks' calls (``TickSubmitter``) and the schedules' states
(``write_states``), in JetStream atomic batches where the streams take them (``ember.wire.atomic``).

A tick of a thousand schedules used to be three thousand requests, each with its own future, timeout and ack:
most of the control plane's CPU at that instant, and what made the last tick's call start late. Now each kind goes
in batches of up to a thousand messages; what a batch does not store (a status or a state written meanwhile, a tick
queued before by another control plane, the server's limit on batches in flight) is written one by one, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from nats.js.api import Header

from ember.wire import SpawnReply, encoder, subjects
from ember.wire.atomic import MAX_BATCH, try_atomic
from ember.wire.schedules import ScheduleState
from ember_platform.calls.durable import Calls, Submission

Write = tuple[str, ScheduleState, int]  # a key, its new state, the revision it was made from (0: created)


class TickSubmitter:
    """The ticks' calls of one pass, queued together: a ``submit`` waits for the others made in the same turn of the
    event loop (a pass handles its due schedules concurrently), then all go in one ``Calls.submit_many``."""

    def __init__(self, calls: Calls) -> None:
        self._calls = calls
        self._pending: list[tuple[Submission, asyncio.Future[SpawnReply]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def submit(self, tick: Submission) -> SpawnReply:
        """The tick's call queued (its reply), or the ``EmberError`` that kept it from being queued."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SpawnReply] = loop.create_future()
        if not self._pending:  # after the steps already waiting: the other schedules of this pass
            loop.call_soon(self._flush)
        self._pending.append((tick, future))
        return await future

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        task = asyncio.get_running_loop().create_task(self._send(pending), name="schedule-submit")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, pending: list[tuple[Submission, asyncio.Future[SpawnReply]]]) -> None:
        try:
            replies = await self._calls.submit_many([tick for tick, _ in pending])
        except BaseException as exc:  # none waits for ever
            for _, future in pending:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), reply in zip(pending, replies, strict=True):
            if future.done():  # its pass was cancelled
                continue
            if isinstance(reply, BaseException):
                future.set_exception(reply)
            else:
                future.set_result(reply)


async def write_states(js: Any, writes: list[Write], atomic: bool, one: Callable[[str, ScheduleState, int],
                                                                                   Awaitable[bool]],
                       written: Callable[[str, ScheduleState, int], None]) -> list[bool]:
    """Write each state with a compare-and-set against the revision it was made from (0: create it): in atomic
    batches where ``atomic``, each batch's states then told to ``written`` (key, state, revision); what a batch did not
    store goes through ``one`` (the loop's own write). Whether each was written, in order."""
    done = [False] * len(writes)
    if atomic:
        for start in range(0, len(writes), MAX_BATCH):
            chunk = writes[start:start + MAX_BATCH]
            messages = [(f"$KV.{subjects.SCHEDULES_BUCKET}.{key}", encoder.encode(state),
                         {Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: str(read)}) for key, state, read in chunk]
            last = await try_atomic(js, messages, "schedule states")
            if last is None:
                continue  # one by one, below
            for i, (key, state, _read) in enumerate(chunk):
                written(key, state, last - (len(chunk) - 1 - i))  # a batch's messages are stored in a row
                done[start + i] = True
    rest = [i for i, ok in enumerate(done) if not ok]
    for i, ok in zip(rest, await asyncio.gather(*(one(*writes[i]) for i in rest)), strict=True):
        done[i] = ok
    return done
