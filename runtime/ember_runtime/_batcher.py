"""The micro-batcher: groups calls that arrive within a window and runs them off the event loop.

The first call blocks; the rest fill the batch until it is full or ``window_s`` has passed since the
first arrived. Calls whose deadline passed are answered with a deadline error and never run. A
failing batch fails its calls, never the loop; the output length is checked against the input's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from ember._errors import DeadlineExceededError, EmberError, OverloadedError, RemoteError, UnavailableError

log = logging.getLogger("ember.batcher")



@dataclass(eq=False)
class Call:
    """One queued call: its decoded input, deadline, and how to answer it (once)."""

    value: Any
    deadline: float
    answer: Callable[[Any, EmberError | None, int], Awaitable[None]]
    call_id: str = ""
    enqueued_at: float = field(default_factory=time.monotonic)


class Batcher:
    """Batches calls to ``run(values) -> outputs`` (same length) on ``executor``."""

    def __init__(self, run: Callable[[list[Any]], list[Any]], *, max_size: int, window_s: float,
                 executor: Executor, max_queue: int = 1024, name: str = "batcher") -> None:
        self._run = run
        self.max_size = max_size
        self.window_s = window_s
        self._executor = executor
        self._queue: asyncio.Queue[Call] = asyncio.Queue(maxsize=max_queue)
        self._closed = False
        self.name = name
        self.calls = 0
        self.batches = 0

    def submit(self, call: Call) -> None:
        """Queue a call; raises ``OverloadedError`` (with the numbers) when the queue is full."""
        if self._closed:
            raise UnavailableError("this replica is shutting down", retry_after_s=1.0)
        try:
            self._queue.put_nowait(call)
        except asyncio.QueueFull:
            raise OverloadedError(
                f"{self.name}: queue is full ({self._queue.qsize()}/{self._queue.maxsize} calls waiting)",
                retry_after_s=1.0) from None

    def close(self) -> None:
        """Stop intake; :meth:`run_forever` returns once the queued calls are answered."""
        self._closed = True
        if self._queue.empty():
            self._queue.put_nowait(_STOP)

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    async def run_forever(self) -> None:
        while True:
            batch = await self._collect()
            live = await self._drop_expired([c for c in batch if c is not _STOP])
            if live:
                await self._execute(live)
            if any(c is _STOP for c in batch) or (self._closed and self._queue.empty()):
                return

    async def _collect(self) -> list[Call]:
        batch = [await self._queue.get()]
        if batch[0] is _STOP:
            return batch
        close_at = time.monotonic() + self.window_s
        while len(batch) < self.max_size:
            try:
                batch.append(self._queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = close_at - time.monotonic()
            if remaining <= 0 or self._closed:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def _drop_expired(self, batch: list[Call]) -> list[Call]:
        now = time.time()
        live = []
        for call in batch:
            if call.deadline <= now:
                await call.answer(None, DeadlineExceededError("the call's deadline passed while it was queued",
                                                              call_id=call.call_id), 0)
            else:
                live.append(call)
        return live

    async def _execute(self, batch: list[Call]) -> None:
        loop = asyncio.get_running_loop()
        size = len(batch)
        self.batches += 1
        self.calls += size
        try:
            outputs = await loop.run_in_executor(self._executor, self._run, [c.value for c in batch])
            if not isinstance(outputs, list | tuple) or len(outputs) != size:
                got = len(outputs) if isinstance(outputs, list | tuple) else type(outputs).__name__
                raise RemoteError(f"the batched function returned {got} outputs for {size} inputs; "
                                  "return a list with one output per input", remote_type="BatchSizeMismatch")
        except EmberError as exc:
            await _answer_all(batch, exc)
            return
        except Exception as exc:
            log.exception("%s: batch of %d failed", self.name, size)
            await _answer_all(batch, RemoteError(str(exc) or type(exc).__name__, remote_type=type(exc).__name__))
            return
        for call, output in zip(batch, outputs, strict=True):
            await call.answer(output, None, size)


async def _answer_all(batch: list[Call], error: EmberError) -> None:
    for call in batch:
        await call.answer(None, error, len(batch))


async def _never(*_: Any) -> None:
    raise AssertionError("the stop marker is never answered")


_STOP = Call(value=None, deadline=float("inf"), answer=_never, call_id="<stop>")
