"""Continuous batching in a replica: one step loop per ``ember.Continuous`` method.

Each call becomes an ``ember.Sequence`` that joins the running set before the next step (at most ``max_seqs`` run:
the batcher's slots). A step calls the user's method once, on a thread of its own, with every running sequence
whose reader has credit left, and hands each piece to its caller's stream as soon as the step returns. Sequences
that joined since the last step take the next one alone, before the running ones' next decode (their prefill goes
first, as vLLM's scheduler does): a new caller's first piece waits for the step under way and its own prefill, not
for a decode of every running sequence too. The step after such a step runs every ready sequence, new ones included:
the running ones wait one step at most, however many new ones come. A sequence
leaves when its piece is None, at its ``max_tokens``, once its text holds a stop string, at its deadline, or when
its caller went away (it is then dropped before the next step: its slot is free within one step). A step that
fails, or answers a list of the wrong length, fails the sequences it ran; the loop goes on with the others.

A step cannot be interrupted: one that hangs holds its sequences (``running``) however their calls end, and
``step_since`` tells the replica's stuck watch how long it has run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ember._errors import DeadlineExceededError, EmberError, RemoteError
from ember._llm import Sequence
from ember.wire.openai import Request
from ember_runtime.replica.streams import StreamClosed, StreamSink

log = logging.getLogger("ember.continuous")
Step = Callable[[list[Sequence]], list[str | None]]


@dataclass
class _Entry:
    seq: Sequence
    sink: StreamSink | None  # None: a queued call, its pieces collected into one list
    deadline: float
    done: asyncio.Future[list[str]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    stepped: bool = False  # it ran in a step already (its first step is its prefill)

    @property
    def ready(self) -> bool:
        """It may take a piece now (its reader has credit)."""
        return self.sink is None or self.sink.produced < self.sink.granted


class StepLoop:
    """Runs ``step`` over the running sequences while there are any; ``generate`` adds one and waits for its end."""

    def __init__(self, step: Step, name: str) -> None:
        self._step = step
        self.name = name
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ember-step-{name}")
        self._running: list[_Entry] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.steps = 0  # steps run so far
        # The last step ran new sequences alone, others waiting: the next one runs every ready sequence, so that
        # a stream of new ones (each freeing its slot at once) cannot hold the running ones back for more than a step.
        self._prefilled = False
        self.pieces = 0  # pieces generated so far
        self.step_since: float | None = None  # when the step under way began (monotonic); None between steps

    @property
    def running(self) -> int:
        """The sequences in the running set (each holds a slot)."""
        return len(self._running)

    async def generate(self, request: Request, call_id: str, deadline: float, sink: StreamSink | None) -> list[str]:
        """Run one sequence to its end; its pieces (also sent to ``sink`` as they come). Raises ``StreamClosed``
        when its caller went away."""
        entry = _Entry(Sequence(request, call_id), sink, deadline)
        self._running.append(entry)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"steps-{self.name}")
        try:
            return await entry.done
        finally:
            entry.seq.cancelled = True  # however it ended (a cancelled call's task too): it leaves at the next step

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for entry in self._running:
            _settle(entry, StreamClosed("the replica stopped"))
        self._running.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self._running:
            self._leave_gone()
            ready = [e for e in self._running if e.ready]
            if not ready:
                await self._wait_credit()
                continue
            fresh = [e for e in ready if not e.stepped]
            if fresh and not self._prefilled:  # the new ones first, alone; never twice in a row (see ``_prefilled``)
                ready = fresh
            self._prefilled = len(ready) < len(self._running) and ready == fresh
            for entry in ready:
                entry.stepped = True
            seqs = [e.seq for e in ready]
            self.step_since = time.monotonic()
            try:
                pieces = await loop.run_in_executor(self._executor, self._step, seqs)
                if not isinstance(pieces, list) or len(pieces) != len(seqs):
                    raise RemoteError(f"the step of {self.name} answered {_length(pieces)} for {len(seqs)} "
                                      "sequences: it returns one piece (or None) per sequence, in order",
                                      remote_type="ValueError")
            except BaseException as exc:  # SystemExit too (sys.exit in the step): its sequences', not the loop's
                if isinstance(exc, asyncio.CancelledError) and _cancelling():  # the loop itself is stopped
                    raise
                error = exc if isinstance(exc, EmberError) else RemoteError(f"{type(exc).__name__}: {exc}",
                                                                            remote_type=type(exc).__name__)
                log.warning("a step of %s failed: %s", self.name, error)
                for entry in ready:
                    _settle(entry, error)
                self._running = [e for e in self._running if not e.done.done()]
                continue
            finally:
                self.step_since = None
            self.steps += 1
            for entry, piece in zip(ready, pieces, strict=True):
                self._take(entry, piece)
            self._running = [e for e in self._running if not e.done.done()]

    def _take(self, entry: _Entry, piece: Any) -> None:
        seq = entry.seq
        if seq.cancelled or entry.done.done():
            return
        if piece is None:
            _settle(entry)
            return
        if not isinstance(piece, str):
            _settle(entry, RemoteError(f"the step of {self.name} gave a {type(piece).__name__} for a sequence: a "
                                       "piece is a str, or None to end it", remote_type="TypeError"))
            return
        seq.pieces.append(piece)
        self.pieces += 1
        if entry.sink is not None:
            try:
                entry.sink.put_now(piece)
            except EmberError as exc:
                _settle(entry, exc)
                return
        request = seq.request
        if len(seq.pieces) >= request.limit or _ends_in_stop(seq.pieces, request.stops):
            _settle(entry)

    def _leave_gone(self) -> None:
        """Drop the sequences whose caller went away or whose deadline passed: their slots are free."""
        now = time.time()
        for entry in self._running:
            if entry.seq.cancelled or (entry.sink is not None and entry.sink.cancelled):
                entry.seq.cancelled = True
                _settle(entry, StreamClosed("the caller went away"))
            elif now >= entry.deadline:
                _settle(entry, DeadlineExceededError("the sequence ran past the call's deadline",
                                                     call_id=entry.seq.call_id))
        self._running = [e for e in self._running if not e.done.done()]

    async def _wait_credit(self) -> None:
        """No running sequence may take a piece now: wait until a reader grants credit, a caller goes away or a
        sequence joins (at most a second: deadlines are checked then)."""
        self._wake.clear()
        events = [self._wake] + [e.sink.credit_event for e in self._running if e.sink is not None]
        for event in events[1:]:
            event.clear()
        if any(e.ready for e in self._running):
            return
        waits = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(waits, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()


def _settle(entry: _Entry, error: BaseException | None = None) -> None:
    entry.seq.done = True  # before the next step: a step may reuse what it held
    if entry.done.done():
        return
    if error is None:
        entry.done.set_result(list(entry.seq.pieces))
    else:
        entry.done.set_exception(error)
        entry.done.exception()  # retrieved: a sequence nobody awaits any more logs nothing


def _length(pieces: Any) -> str:
    return f"{len(pieces)} pieces" if isinstance(pieces, list) else f"a {type(pieces).__name__}"


def _cancelling() -> bool:
    """Whether this task is being cancelled: a ``CancelledError`` out of the user's step (a future it cancelled, say)
    is that step's failure, not the loop's end."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _ends_in_stop(pieces: list[str], stops: list[str]) -> bool:
    """Whether a stop string ends in the last piece: only the text it could span is joined (the whole text, joined at
    each step, cost the square of a sequence's length), since a stop found before would have ended the sequence."""
    if not stops or not pieces:
        return False
    need, size, tail = len(pieces[-1]) + max(map(len, stops)) - 1, 0, []
    for piece in reversed(pieces):
        tail.append(piece)
        size += len(piece)
        if size >= need:
            break
    text = "".join(reversed(tail))
    return any(stop in text for stop in stops)
