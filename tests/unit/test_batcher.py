"""The replica's micro-batcher, driven directly on an event loop (no NATS)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from ember._errors import DeadlineExceededError, EmberError, OverloadedError, RemoteError, UnavailableError
from ember_runtime import Batcher, Call


class Recorder:
    """Collects each call's answer: (output, error, batch size)."""

    def __init__(self) -> None:
        self.answers: dict[int, tuple[Any, EmberError | None, int]] = {}
        self.done = asyncio.Event()
        self.expected = 0

    def call(self, key: int, value: Any, deadline: float | None = None) -> Call:
        self.expected += 1

        async def answer(output: Any, error: EmberError | None, size: int) -> None:
            assert key not in self.answers, "a call was answered twice"
            self.answers[key] = (output, error, size)
            if len(self.answers) == self.expected:
                self.done.set()

        return Call(value, time.time() + 60 if deadline is None else deadline, answer, call_id=str(key))


def run(coro_fn) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(), 20))


def make(run_fn, **kw) -> tuple[Batcher, ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(1)
    opts = {"max_size": 8, "window_s": 0.05, "executor": pool} | kw
    return Batcher(run_fn, **opts), pool


def test_calls_arriving_together_share_a_batch_and_keep_their_own_outputs():
    seen: list[list[int]] = []

    def double(xs: list[int]) -> list[int]:
        seen.append(list(xs))
        return [2 * x for x in xs]

    async def main() -> Recorder:
        batcher, pool = make(double)
        rec = Recorder()
        loop = asyncio.create_task(batcher.run_forever())
        for i in range(20):
            batcher.submit(rec.call(i, i))
        await rec.done.wait()
        batcher.close()
        await loop
        pool.shutdown()
        return rec

    rec = run(main)
    assert {k: v[0] for k, v in rec.answers.items()} == {i: 2 * i for i in range(20)}
    assert [len(b) for b in seen] == [8, 8, 4]  # bounded by max_size, in arrival order
    assert all(rec.answers[i][2] == len(next(b for b in seen if i in b)) for i in range(20))


def test_a_lone_call_waits_at_most_the_window():
    async def main() -> float:
        batcher, pool = make(lambda xs: xs, window_s=0.2)
        rec = Recorder()
        loop = asyncio.create_task(batcher.run_forever())
        started = time.monotonic()
        batcher.submit(rec.call(0, "x"))
        await rec.done.wait()
        elapsed = time.monotonic() - started
        batcher.close()
        await loop
        pool.shutdown()
        return elapsed

    assert 0.15 <= run(main) < 2.0


def test_expired_calls_are_answered_with_a_deadline_error_and_never_run():
    ran: list[Any] = []

    async def main() -> Recorder:
        batcher, pool = make(lambda xs: ran.extend(xs) or xs)
        rec = Recorder()
        loop = asyncio.create_task(batcher.run_forever())
        batcher.submit(rec.call(0, "late", deadline=time.time() - 1))
        batcher.submit(rec.call(1, "fine"))
        await rec.done.wait()
        batcher.close()
        await loop
        pool.shutdown()
        return rec

    rec = run(main)
    assert isinstance(rec.answers[0][1], DeadlineExceededError)
    assert rec.answers[1][0] == "fine" and ran == ["fine"]


def test_a_failing_batch_fails_its_calls_not_the_loop():
    def fragile(xs: list[str]) -> list[str]:
        if "bad" in xs:
            raise KeyError("bad input")
        return xs

    async def main() -> Recorder:
        batcher, pool = make(fragile, window_s=0.0, max_size=1)
        rec = Recorder()
        loop = asyncio.create_task(batcher.run_forever())
        batcher.submit(rec.call(0, "bad"))
        batcher.submit(rec.call(1, "good"))
        await rec.done.wait()
        batcher.close()
        await loop
        pool.shutdown()
        return rec

    rec = run(main)
    error = rec.answers[0][1]
    assert isinstance(error, RemoteError) and error.remote_type == "KeyError"
    assert rec.answers[1] == ("good", None, 1)


def test_an_output_of_the_wrong_length_is_a_clear_error_for_every_call():
    async def main() -> Recorder:
        batcher, pool = make(lambda xs: xs[:-1])
        rec = Recorder()
        loop = asyncio.create_task(batcher.run_forever())
        for i in range(3):
            batcher.submit(rec.call(i, i))
        await rec.done.wait()
        batcher.close()
        await loop
        pool.shutdown()
        return rec

    rec = run(main)
    for _, error, _ in rec.answers.values():
        assert isinstance(error, RemoteError) and "2 outputs for 3 inputs" in error.message


def test_a_full_queue_refuses_with_the_numbers():
    started, gate = threading.Event(), threading.Event()

    def blocking(xs: list[int]) -> list[int]:
        started.set()
        gate.wait()
        return xs

    async def main() -> None:
        batcher, pool = make(blocking, max_size=1, window_s=0.0, max_queue=2)
        rec = Recorder()
        loop = asyncio.create_task(batcher.run_forever())
        batcher.submit(rec.call(0, 0))
        await asyncio.to_thread(started.wait)  # call 0 left the queue and blocks in the executor
        batcher.submit(rec.call(1, 1))
        batcher.submit(rec.call(2, 2))
        with pytest.raises(OverloadedError, match="2/2") as info:
            batcher.submit(rec.call(3, 3))
        assert info.value.retry_after_s
        rec.expected -= 1
        gate.set()
        await rec.done.wait()
        batcher.close()
        await loop
        pool.shutdown()

    run(main)


def test_close_answers_what_was_queued_then_refuses_new_calls():
    async def main() -> Recorder:
        batcher, pool = make(lambda xs: xs, window_s=0.01, max_size=2)
        rec = Recorder()
        for i in range(5):
            batcher.submit(rec.call(i, i))
        batcher.close()
        with pytest.raises(UnavailableError):
            batcher.submit(rec.call(99, 99))
        await batcher.run_forever()
        pool.shutdown()
        return rec

    rec = run(main)
    assert sorted(rec.answers) == [0, 1, 2, 3, 4]


def test_model_code_runs_off_the_event_loop():
    loop_threads: list[int] = []

    def where(xs: list[int]) -> list[int]:
        loop_threads.append(threading.get_ident())
        return xs

    async def main() -> None:
        batcher, pool = make(where, window_s=0.0)
        rec = Recorder()
        task = asyncio.create_task(batcher.run_forever())
        batcher.submit(rec.call(0, 0))
        await rec.done.wait()
        batcher.close()
        await task
        pool.shutdown()

    run(main)
    assert loop_threads and loop_threads[0] != threading.get_ident()
