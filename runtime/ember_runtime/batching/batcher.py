"""The micro-batcher: deadline- and priority-aware, adaptive, failure-isolating.

Calls wait in a bounded priority queue (``interactive`` before ``batch``, earliest deadline first within a class).
When the executor is free the batcher dispatches at once unless waiting pays (see ``policy``), and always when one
call waits and no batch runs (a lone call); a batch is bounded by count, by total cost and by the largest size that
did not run out of memory. Model code runs on the executor thread (the replica's ``ModelThread``), so the event
loop keeps receiving and decoding the next calls while a batch runs. Expired calls are answered with a deadline
error and never run; cancelled calls are dropped; a failing batch is bisected so that only the inputs at fault get
the error.

With ``slots`` above one (a function's ``max_concurrency``), up to that many batches run at once: on the
executor's threads for sync code, as tasks on the event loop for ``async def`` code (``run`` returning a
coroutine), which never touches the executor.

An unbatched function (``run_ready`` above one) still runs each call alone, but the calls that are ready when the
executor is free run back to back in one hop to its thread (each with its own context, deadline check and
failure), for up to ``RUN_READY_BUDGET_S``; the rest go back to the queue, first in line. Their answers leave
together, in one frame per caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import inspect
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from ember import _tracing as tracing
from ember._errors import CallCancelledError, DeadlineExceededError, EmberError, OverloadedError, UnavailableError
from ember_runtime.batching import spans
from ember_runtime.batching.call import Call
from ember_runtime.batching.costmodel import CostModel
from ember_runtime.batching.isolation import BatchReport, BatchRunner, Outcome
from ember_runtime.batching.modelthread import ModelThread
from ember_runtime.batching.policy import Limits, QueueView, hold_for
from ember_runtime.batching.running import Run, halted
from ember_runtime.batching.stats import BatcherMetrics

T = TypeVar("T")
log = logging.getLogger("ember.batcher")
PRIORITY_RANK = {"interactive": 0, "batch": 1}
_GAP_SMOOTHING = 0.2
RUN_READY_BUDGET_S = 0.005  # one hop runs ready unbatched calls back to back for at most this long


class Batcher:
    """Batches calls to ``run(values) -> outputs`` (same length), ``slots`` batches at a time on ``executor``
    (or on the event loop when ``run`` is an ``async def``)."""

    def __init__(self, run: Callable[[list[Any]], Any], *, max_size: int, window_s: float,
                 executor: Executor, max_queue: int = 1024, max_cost: float | None = None,
                 latency_budget_s: float | None = None, cost_model: CostModel | None = None,
                 group_by_cost: bool = False, name: str = "batcher", slots: int = 1,
                 serving: Callable[[list[Call]], AbstractContextManager[Any]] | None = None,
                 run_ready: int = 1) -> None:
        self.name = name
        # ready calls of an unbatched function one hop may run, each alone (sync code, one slot, batches of one)
        self.run_ready = run_ready if max_size == 1 and slots == 1 and not inspect.iscoroutinefunction(run) else 1
        self._serving = serving or (lambda _batch: contextlib.nullcontext())
        self.limits = Limits(max_size=max_size, window_s=window_s, max_cost=max_cost,
                             latency_budget_s=latency_budget_s)
        self.max_queue = max_queue
        self.group_by_cost = group_by_cost
        self.model = cost_model or CostModel()
        self.metrics = BatcherMetrics()
        self.oom_limit: int | None = None
        self._runner = BatchRunner(run, name)
        self._async = inspect.iscoroutinefunction(run)
        self._executor = executor
        self.slots = slots
        self._running: dict[int, tuple[float, int]] = {}  # batch number -> (start, size), while it runs
        self._batch_ids = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()  # batches running beside the loop (slots > 1)
        self._heap: list[tuple[int, float, int, Call]] = []
        self._by_id: dict[str, Call] = {}
        self._live: dict[str, Call] = {}  # calls that run now, by id
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._closed = False
        self._mean_gap = math.inf
        self._last_arrival: float | None = None
        self._busy_until: float | None = None
        self.in_flight = 0  # calls in the batches that run now
        self.running_since: float | None = None  # when the oldest batch that runs now started (monotonic)
        self.room = asyncio.Event()  # set whenever calls leave the queue or a batch ends
        self.on_submit: Callable[[], None] | None = None  # told of every call queued (an idle replica's reports wake)

    # -- intake ------------------------------------------------------------------------------------

    def submit(self, call: Call) -> None:
        """Queue a call, or raise: ``UnavailableError`` when closing, ``OverloadedError`` when the queue is
        full or the call is predicted to miss its deadline (both carry the numbers and a retry delay)."""
        if self._closed:
            raise UnavailableError("this replica is shutting down", retry_after_s=1.0)
        if len(self._heap) >= self.max_queue:
            self.metrics.rejected += 1
            raise OverloadedError(f"{self.name}: queue is full ({len(self._heap)}/{self.max_queue} calls waiting)",
                                  retry_after_s=max(1.0, self._drain_estimate()))
        self._admit_deadline(call)
        self._note_arrival(call.enqueued_at)
        call.seq = next(self._seq)
        self._push(call)
        self._wake.set()
        if self.on_submit is not None:
            self.on_submit()

    def _push(self, call: Call) -> None:
        heapq.heappush(self._heap, (PRIORITY_RANK.get(call.priority, 0), call.deadline, call.seq, call))
        if call.call_id:
            self._by_id[call.call_id] = call

    def _forget(self, call: Call) -> None:
        """Drop ``call`` from the index of queued calls (a call answered there would be cancelled, and answered,
        again), unless a newer call holds its id."""
        if self._by_id.get(call.call_id) is call:
            del self._by_id[call.call_id]

    def cancel(self, call_id: str) -> bool:
        """Drop a queued call whose caller went away; False when it is not (or no longer) queued."""
        call = self._by_id.pop(call_id, None)
        if call is None:
            return False
        call.cancelled = True
        self.metrics.cancelled += 1
        if call.span is not None:  # never answered: its span ends here
            tracing.end(call.span, "cancelled")
        return True

    async def withdraw(self, call_id: str) -> str:
        """Cancel a call, queued or running, and answer it ``cancelled`` (see ``running``): "queued" or "running"
        for where it was, "" when this batcher holds no such call (or it was cancelled already)."""
        call = self._by_id.get(call_id)
        where = "queued"
        if call is None or call.cancelled:
            call, where = self._live.get(call_id), "running"
            if call is None or call.cancelled:
                return ""
            self.metrics.cancelled += 1
        else:
            self.cancel(call_id)
            where = "running" if call.run is not None else "queued"  # an unbatched call's hop holds it
        if call.run is not None:  # an unbatched call's hop has it; or a batch runs it
            call.run.cancel(call)
        error = CallCancelledError(f"the call was cancelled while {where}", call_id=call_id)
        if call.span is not None and where == "running":
            spans.answered(call.span, error)
        await self._answer(call, None, error, 0)
        return where

    def close(self) -> None:
        """Stop intake; :meth:`run_forever` returns once the queued calls are answered."""
        self._closed = True
        self._wake.set()

    async def fail_pending(self, error: EmberError) -> int:
        """Answer every queued call with ``error`` (a replica that must stop now); returns how many."""
        failed = 0
        while self._heap:
            call = heapq.heappop(self._heap)[3]
            self._by_id.pop(call.call_id, None)
            if not call.cancelled:
                await self._answer(call, None, error, 0)
                failed += 1
        return failed

    @property
    def queued(self) -> int:
        return len(self._heap)

    @property
    def vacancy(self) -> int:
        """Calls that could start now beyond those queued: free slots times the batch size. (An unbatched function's
        hop may run more, but a queue hands it one at a time: a queued call stays cancellable until it can start.)"""
        return self.capacity * self.slots - len(self._heap) - self.in_flight

    def _note_arrival(self, now: float) -> None:
        if self._last_arrival is not None:
            gap = max(now - self._last_arrival, 0.0)
            self._mean_gap = gap if math.isinf(self._mean_gap) else \
                _GAP_SMOOTHING * gap + (1 - _GAP_SMOOTHING) * self._mean_gap
        self._last_arrival = now

    def _admit_deadline(self, call: Call) -> None:
        if not self.model.fitted or not math.isfinite(call.deadline):
            return
        now = time.monotonic()
        cap = self.capacity
        left = call.deadline_mono() - now
        # With every queued call ahead of it, it would still finish in time: no need to count those really ahead.
        if self._busy_left(now) + (len(self._heap) // (cap * self.slots) + 1) * self.model.predict(cap) <= left:
            return
        key = (PRIORITY_RANK.get(call.priority, 0), call.deadline)
        ahead = sum(1 for rank, deadline, _, c in self._heap if (rank, deadline) <= key and not c.cancelled)
        start = now + self._busy_left(now) + (ahead // (cap * self.slots)) * self.model.predict(cap)
        finish = start + self.model.predict(min(cap, ahead % cap + 1))
        if finish - now > left:
            self.metrics.rejected += 1
            raise OverloadedError(
                f"{self.name}: predicted to finish in {finish - now:.3f}s with {ahead} calls ahead, "
                f"after its deadline in {left:.3f}s", retry_after_s=max(1.0, finish - now))

    # -- the loop ----------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """The largest batch to form now: ``max_size``, lowered after an out-of-memory split."""
        return min(self.limits.max_size, self.oom_limit or self.limits.max_size)

    async def run_forever(self) -> None:
        try:
            await self._loop()
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            if not self._heap or len(self._running) >= self.slots:
                if self._closed and not self._heap:
                    await asyncio.gather(*self._tasks)  # the batches still running finish (drain)
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            wait = 0.0 if self._closed or self._lone() else self._hold_for(time.monotonic())
            if wait > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                continue
            batch = await self._take()
            if not batch:
                continue
            if self.slots == 1:
                await self._execute(batch, self._begin(batch))
            else:
                # counted as running now, before its task starts: the loop's next turn sees the slot taken
                task = asyncio.create_task(self._execute(batch, self._begin(batch)), name=f"{self.name}-batch")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def _lone(self) -> bool:
        """One call waits and no batch runs: it goes at once, whatever the window (a lone call never pays for a wait
        that only a burst's next call could repay; under load, calls queue while a batch runs and fill the next)."""
        return len(self._heap) == 1 and not self._running

    def _hold_for(self, now: float) -> float:
        if self.limits.window_s <= 0 or (self.capacity == 1 and self._heap):
            return 0.0  # no window (an unbatched function's): nothing to wait for
        live = [c for *_, c in self._heap if not c.cancelled]
        if not live:
            return 0.0
        view = QueueView(count=len(live), total_cost=sum(c.cost for c in live),
                         oldest_arrival=min(c.enqueued_at for c in live),
                         earliest_deadline=min(c.deadline_mono() for c in live),
                         newest_arrival=max(c.enqueued_at for c in live))
        limits = Limits(self.capacity, self.limits.window_s, self.limits.max_cost, self.limits.latency_budget_s)
        return hold_for(view, limits, self.model, self._mean_gap, now)

    async def _take(self) -> list[Call]:
        batch = await self._take_in_order()
        if self.group_by_cost and batch:
            batch = self._regroup(batch)
        return batch

    def _regroup(self, batch: list[Call]) -> list[Call]:
        """Keep the batch's most urgent call, and fill the rest with the calls closest to it in cost from it
        and the next ``capacity`` calls waiting in the same class; calls due before the next batch could
        finish stay in whatever their cost. What is left over goes back to the queue."""
        head, rank = batch[0], PRIORITY_RANK.get(batch[0].priority, 0)
        pool = batch[1:]
        now = time.time()
        while self._heap and len(pool) < 2 * self.capacity and self._heap[0][0] == rank:
            if self._heap[0][3].deadline <= now:
                break  # expired: answered by the next take, never run
            call = heapq.heappop(self._heap)[3]
            if not call.cancelled:
                self._forget(call)  # it leaves the queue; one put back is indexed again (``_push``)
                pool.append(call)
        soon = time.time() + 2 * self.model.predict(self.capacity)
        pool.sort(key=lambda c: (c.deadline > soon, abs(math.log(max(c.cost, 1e-9) / max(head.cost, 1e-9)))))
        chosen, cost = [head], head.cost
        for call in pool:
            fits = self.limits.max_cost is None or cost + call.cost <= self.limits.max_cost
            if len(chosen) < self.capacity and fits:
                chosen.append(call)
                cost += call.cost
            else:
                self._push(call)  # back in the queue, where it was
        return chosen

    async def _take_in_order(self) -> list[Call]:
        batch: list[Call] = []
        cost = 0.0
        now = time.time()
        limit = max(self.capacity, self.run_ready)
        while self._heap and len(batch) < limit:
            call = self._heap[0][3]
            if call.cancelled:
                heapq.heappop(self._heap)
                continue
            if call.deadline <= now:
                heapq.heappop(self._heap)
                self._by_id.pop(call.call_id, None)
                self.metrics.expired += 1
                await self._answer(call, None, DeadlineExceededError("the call's deadline passed while it was queued",
                                                                     call_id=call.call_id), 0)
                continue
            if batch and self.limits.max_cost is not None and cost + call.cost > self.limits.max_cost:
                break
            heapq.heappop(self._heap)
            if self.run_ready == 1:  # otherwise it may still be cancelled until its turn in the hop (_execute_each)
                self._by_id.pop(call.call_id, None)
            batch.append(call)
            cost += call.cost
        return batch

    async def _execute(self, batch: list[Call], begun: tuple[int, float]) -> None:
        if self.run_ready > 1:
            await self._execute_each(batch, begun)
            return
        number, started = begun
        traced = spans.begin([c.span for c in batch if c.span is not None], self.name, len(batch)) \
            if tracing.ON else None
        run = Run(batch)
        for call in batch:
            call.run = run
            if call.call_id:
                self._live[call.call_id] = call
        try:
            values = [c.value for c in batch]
            with self._serving(batch):  # what ``ember.current_call()`` answers in the function (copied to its thread)
                report: BatchReport = await self._run_async(batch, values) if self._async else \
                    await self._hop(self._runner, values)
        finally:
            for call in batch:
                self._live.pop(call.call_id, None)
                self._forget(call)
            self._end(number)
            if traced is not None:
                spans.end(traced)
        elapsed = time.monotonic() - started
        if report.clean:
            self.model.observe(len(batch), elapsed)
        if report.oom_limit is not None:
            self.oom_limit = min(self.oom_limit or report.oom_limit, report.oom_limit)
        self.metrics.observe_batch(len(batch), self.limits.max_size, elapsed,
                                   [started - c.enqueued_at for c in batch])
        for call, outcome in zip(batch, report.outcomes, strict=True):
            if call.cancelled:
                continue  # answered when it was cancelled
            if not outcome.ok:
                self.metrics.failed += 1
            await self._answer(call, outcome.value, outcome.error, len(batch))

    async def _execute_each(self, batch: list[Call], begun: tuple[int, float]) -> None:
        """Ready calls of an unbatched function: one hop to the executor runs them one after the other (see
        ``_run_each``); those it had no time for go back to the queue. Each counts as a batch of one."""
        number, started = begun
        traced = spans.begin([c.span for c in batch if c.span is not None], self.name, len(batch)) \
            if tracing.ON else None
        for call in batch:
            call.run = Run([call])
        try:
            ran = await self._hop(self._run_each, batch)
        finally:
            self._end(number)
            if traced is not None:
                spans.end(traced)
        for call in batch[len(ran):]:
            self._push(call)  # first in line again: their seq and deadline are unchanged
        if len(ran) < len(batch):
            self._wake.set()
        for call, (what, outcome, seconds) in zip(batch, ran, strict=False):
            self._by_id.pop(call.call_id, None)
            if what == "cancelled" or call.cancelled:
                continue  # nobody waits for it, or it was answered when cancelled
            if what == "expired":
                self.metrics.expired += 1
            else:
                if what == "clean":
                    self.model.observe(1, seconds)
                self.metrics.observe_batch(1, 1, seconds, [started - call.enqueued_at])
                self.metrics.failed += not outcome.ok
            await self._answer(call, outcome.value, outcome.error, 1)

    async def _answer(self, call: Call, value: Any, error: EmberError | None, batch_size: int) -> None:
        """Answer one call; an answer that raises fails that call alone, never the loop (nor the batch's other calls):
        it is logged, and the call answered with an internal error instead, as far as that goes."""
        try:
            await call.answer(value, error, batch_size)
        except Exception as exc:
            log.exception("%s: answering call %s failed", self.name, call.call_id)
            with contextlib.suppress(Exception):
                await call.answer(None, EmberError(f"the call's answer failed: {type(exc).__name__}: {exc}",
                                                   call_id=call.call_id), batch_size)

    def _hop(self, fn: Callable[[Any], T], arg: Any) -> Awaitable[T]:
        """``fn(arg)`` on the executor, in a copy of this context (the model thread's short way when it is one)."""
        loop = asyncio.get_running_loop()
        if isinstance(self._executor, ModelThread):
            return self._executor.call(loop, contextvars.copy_context().run, fn, arg)
        return loop.run_in_executor(self._executor, contextvars.copy_context().run, fn, arg)

    def _run_each(self, batch: list[Call]) -> list[tuple[str, Outcome, float]]:
        """On the executor thread: run the calls one by one, each alone and in its own ``serving`` context, until
        ``RUN_READY_BUDGET_S`` has passed (always the first). A call past its deadline is not run ("expired"), a
        cancelled one is skipped ("cancelled"); the others "clean" or "ran" (failed, or split after running out of
        memory: no fair timing). Returns (what, outcome, seconds) of the calls it got to, in order."""
        first = time.monotonic()
        ran: list[tuple[str, Outcome, float]] = []
        for call in batch:
            start = time.monotonic()
            if ran and start - first >= RUN_READY_BUDGET_S:
                break
            if call.cancelled:
                ran.append(("cancelled", Outcome(False), 0.0))
            elif call.deadline <= time.time():
                late = DeadlineExceededError("the call's deadline passed while it was queued", call_id=call.call_id)
                ran.append(("expired", Outcome(False, error=late), 0.0))
            else:
                with self._serving([call]):
                    report = self._runner([call.value])
                ran.append(("clean" if report.clean else "ran", report.outcomes[0], time.monotonic() - start))
        return ran

    async def _run_async(self, batch: list[Call], values: list[Any]) -> BatchReport:
        """Async code stops at its batch's earliest deadline, cancelled where it awaits: a call past it can only be
        answered 504 by now, and its slot is free again at once (sync code cannot be interrupted: see the replica's
        stuck watch)."""
        deadline = min(c.deadline for c in batch)
        task = asyncio.ensure_future(self._runner.arun(values))
        if batch[0].run is not None:
            batch[0].run.task = task
        try:
            async with asyncio.timeout(deadline - time.time() if math.isfinite(deadline) else None):
                return await task
        except asyncio.CancelledError:
            if not halted(task):
                raise
            gone = CallCancelledError("the call was cancelled while running")
            return BatchReport(outcomes=[Outcome(False, error=gone) for _ in batch], clean=False)
        except TimeoutError:
            late = DeadlineExceededError("the call ran past its deadline and was cancelled")
            return BatchReport(outcomes=[Outcome(False, error=late) for _ in batch], clean=False)

    def _begin(self, batch: list[Call]) -> tuple[int, float]:
        """Count the batch as running; returns its number and start."""
        number, started = next(self._batch_ids), time.monotonic()
        self._running[number] = started, len(batch)
        self._update_running()
        return number, started

    def _end(self, number: int) -> None:
        del self._running[number]
        self._update_running()
        self._wake.set()  # a slot is free

    def _update_running(self) -> None:
        running = self._running.values()
        self.in_flight = sum(size for _, size in running)
        self.running_since = min((start for start, _ in running), default=None)
        # Only once every slot is taken must a new call wait: until the batch that ends first is done.
        self._busy_until = None if len(self._running) < self.slots else \
            min(start + self.model.predict(size) for start, size in running)
        self.room.set()

    def _busy_left(self, now: float) -> float:
        return max(0.0, self._busy_until - now) if self._busy_until is not None else 0.0

    def _drain_estimate(self) -> float:
        cap = self.capacity
        return self._busy_left(time.monotonic()) + \
            math.ceil(len(self._heap) / (cap * self.slots)) * self.model.predict(cap)
