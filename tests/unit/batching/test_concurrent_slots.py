"""The batcher with several slots (max_concurrency) and with async code, on a real loop and real threads."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from test_batcher import Recorder, run, serve

from ember._errors import DeadlineExceededError, RemoteError
from ember_runtime.batching.batcher import Batcher
from ember_runtime.batching.costmodel import CostModel


def test_sync_calls_run_in_as_many_threads_as_slots():
    barrier = threading.Barrier(4, timeout=10)  # passes only once 4 calls run at the same time

    def model(xs: list[Any]) -> list[Any]:
        barrier.wait()
        return [threading.current_thread().name for _ in xs]

    rec = Recorder()
    with ThreadPoolExecutor(4, thread_name_prefix="slot") as pool:
        b = Batcher(model, max_size=1, window_s=0.0, executor=pool, name="f", slots=4)

        async def body():
            for i in range(8):
                b.submit(rec.call(i))
            await rec.wait_for(8)

        run(lambda: serve(b, body))
    assert all(error is None for _, error, _ in rec.answers.values())
    assert len({output for output, _, _ in rec.answers.values()}) == 4


def test_a_slot_is_never_exceeded_and_in_flight_counts_the_running_calls():
    running, peak = 0, 0
    seen_in_flight: list[int] = []
    b: Batcher

    async def model(xs: list[Any]) -> list[Any]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        seen_in_flight.append(b.in_flight)
        await asyncio.sleep(0.01)
        running -= 1
        return xs

    rec = Recorder()
    with ThreadPoolExecutor(1) as pool:
        b = Batcher(model, max_size=1, window_s=0.0, executor=pool, name="f", slots=3)

        async def body():
            for i in range(12):
                b.submit(rec.call(i))
            await rec.wait_for(12)
            assert b.in_flight == 0 and b.running_since is None and b.vacancy == 3

        run(lambda: serve(b, body))
    assert peak == 3
    assert max(seen_in_flight) == 3
    assert {k: v[0] for k, v in rec.answers.items()} == {i: i for i in range(12)}


def test_async_code_runs_on_the_loop_not_the_executor():
    loop_thread: list[str] = []

    async def model(xs: list[Any]) -> list[Any]:
        loop_thread.append(threading.current_thread().name)
        return xs

    def refuse(*_: Any) -> None:
        raise AssertionError("async code must not reach the executor")

    class NoExecutor(ThreadPoolExecutor):
        submit = refuse  # type: ignore[assignment]

    rec = Recorder()
    with NoExecutor(1) as pool:
        b = Batcher(model, max_size=1, window_s=0.0, executor=pool, name="f", slots=2)

        async def body():
            b.submit(rec.call("x"))
            await rec.wait_for(1)

        run(lambda: serve(b, body))
    assert rec.answers["x"][0] == "x"
    assert loop_thread == [threading.current_thread().name]


def test_an_async_batch_that_fails_is_bisected_to_the_input_at_fault():
    async def model(xs: list[Any]) -> list[Any]:
        if 3 in xs:
            raise ValueError("three")
        return [x * 10 for x in xs]

    rec = Recorder()
    with ThreadPoolExecutor(1) as pool:
        b = Batcher(model, max_size=8, window_s=0.05, executor=pool, name="f")

        async def body():
            for i in range(6):
                b.submit(rec.call(i))
            await rec.wait_for(6)

        run(lambda: serve(b, body))
    assert isinstance(rec.answers[3][1], RemoteError)
    assert {k: v[0] for k, v in rec.answers.items() if k != 3} == {i: i * 10 for i in range(6) if i != 3}


def test_closing_waits_for_the_batches_still_running():
    release = asyncio.Event()

    async def model(xs: list[Any]) -> list[Any]:
        await release.wait()
        return xs

    rec = Recorder()
    with ThreadPoolExecutor(1) as pool:
        b = Batcher(model, max_size=1, window_s=0.0, executor=pool, name="f", slots=4)

        async def body():
            for i in range(3):
                b.submit(rec.call(i))
            while b.in_flight < 3:
                await asyncio.sleep(0)
            b.close()
            asyncio.get_running_loop().call_later(0.05, release.set)

        run(lambda: serve(b, body))
    assert len(rec.answers) == 3 and all(e is None for _, e, _ in rec.answers.values())


@pytest.mark.parametrize("slots", [1, 4])
def test_the_deadline_admission_counts_the_slots(slots):
    model = CostModel()
    for _ in range(20):
        model.observe(1, 1.0)  # one call takes a second
    with ThreadPoolExecutor(1) as pool:
        b = Batcher(lambda xs: xs, max_size=1, window_s=0.0, executor=pool, name="f", cost_model=model, slots=slots)
        rec = Recorder()

        async def submit_all() -> int:
            admitted = 0
            for i in range(8):
                try:
                    b.submit(rec.call(i, deadline=time.time() + 3.5))
                    admitted += 1
                except Exception:
                    pass
            return admitted

        admitted = asyncio.run(submit_all())
    assert admitted == (3 if slots == 1 else 8)


def test_async_code_is_cancelled_at_its_deadline_and_frees_its_slot():
    cancelled = asyncio.Event()

    async def model(xs: list[Any]) -> list[Any]:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return xs

    rec = Recorder()
    with ThreadPoolExecutor(1) as pool:
        b = Batcher(model, max_size=1, window_s=0.0, executor=pool, name="f", slots=2)

        async def body():
            b.submit(rec.call("late", deadline=time.time() + 0.2))
            await rec.wait_for(1)
            assert cancelled.is_set() and b.in_flight == 0

        run(lambda: serve(b, body))
    assert isinstance(rec.answers["late"][1], DeadlineExceededError)
