"""An unbatched function's ready calls: one hop to the model thread runs them back to back, each alone (its own
context, deadline and failure), and they are answered together; the cost model's fit costs the same per call
whatever its window."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import ember
from ember._errors import DeadlineExceededError, EmberError, RemoteError
from ember_runtime.batching import batcher as batcher_module
from ember_runtime.batching.batcher import Batcher, Call
from ember_runtime.batching.costmodel import CostModel, _least_squares
from ember_runtime.replica.calling import serving


class CountingPool(ThreadPoolExecutor):
    """An executor that counts its hops."""

    def __init__(self) -> None:
        super().__init__(1)
        self.hops = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.hops += 1
        return super().submit(fn, *args, **kwargs)


class Unbatched:
    """An unbatched function as the replica runs it (one value per call); its first call waits for ``release``."""

    def __init__(self, fn: Any = lambda x: x) -> None:
        self.fn = fn
        self.runs: list[list[Any]] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, values: list[Any]) -> list[Any]:
        self.runs.append(list(values))
        if len(self.runs) == 1:
            self.started.set()
            self.release.wait(10)
        return [self.fn(v) for v in values]


class Answers:
    def __init__(self) -> None:
        self.got: dict[str, tuple[Any, EmberError | None, int]] = {}
        self.turns: list[int] = []  # the loop turn (a counter bumped by call_soon) each answer came in
        self.changed = asyncio.Event()

    def call(self, key: str, value: Any, deadline: float | None = None) -> Call:
        async def answer(output: Any, error: EmberError | None, size: int) -> None:
            assert key not in self.got, f"{key} answered twice"
            self.got[key] = (output, error, size)
            self.changed.set()

        return Call(value, time.time() + 60 if deadline is None else deadline, answer, call_id=key)

    async def wait_for(self, count: int) -> None:
        while len(self.got) < count:
            self.changed.clear()
            await self.changed.wait()


def _unbatched(fn: Any, pool: ThreadPoolExecutor, run_ready: int = 64, **kw: Any) -> Batcher:
    return Batcher(fn, max_size=1, window_s=0.0, executor=pool, name="f", run_ready=run_ready, **kw)


async def _serve(b: Batcher, body: Any) -> Any:
    loop = asyncio.create_task(b.run_forever())
    try:
        return await body()
    finally:
        b.close()
        await loop


def _one_then_the_rest(b: Batcher, runner: Unbatched, answers: Answers, n: int) -> Any:
    """A body for ``_serve``: call c0 alone (its hop takes the model thread), c1 to c<n-1> while it runs, then release
    the runner and wait for the n answers."""
    async def body() -> None:
        b.submit(answers.call("c0", 0))
        await asyncio.to_thread(runner.started.wait)
        for i in range(1, n):
            b.submit(answers.call(f"c{i}", i))
        runner.release.set()
        await answers.wait_for(n)

    return body


def _run(coro_fn: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(), 20))


def test_ready_calls_run_one_by_one_in_one_hop_and_are_answered_as_batches_of_one():
    fn = Unbatched(lambda x: 2 * x)
    answers = Answers()
    with CountingPool() as pool:
        b = _unbatched(fn, pool)

        _run(lambda: _serve(b, _one_then_the_rest(b, fn, answers, 11)))
        assert pool.hops == 2  # the first call alone, then the ten that were ready
    assert fn.runs == [[i] for i in range(11)]  # each call alone, in order
    assert answers.got == {f"c{i}": (2 * i, None, 1) for i in range(11)}
    assert b.metrics.calls == 11 and b.metrics.batches == 11


def test_without_run_ready_each_call_is_its_own_hop():
    fn = Unbatched()
    answers = Answers()
    with CountingPool() as pool:
        b = _unbatched(fn, pool, run_ready=1)

        _run(lambda: _serve(b, _one_then_the_rest(b, fn, answers, 5)))
        assert pool.hops == 5


def test_a_failing_call_fails_alone_and_no_call_runs_twice():
    def fn(x: int) -> int:
        if x == 3:
            raise ValueError("three")
        return x

    runner = Unbatched(fn)
    answers = Answers()
    with ThreadPoolExecutor(1) as pool:
        b = _unbatched(runner, pool)

        _run(lambda: _serve(b, _one_then_the_rest(b, runner, answers, 7)))
    assert sorted(v for run in runner.runs for v in run) == list(range(7))  # no bisection, no second run
    _, error, _ = answers.got["c3"]
    assert isinstance(error, RemoteError) and "three" in str(error)
    assert all(answers.got[f"c{i}"][:2] == (i, None) for i in range(7) if i != 3)
    assert b.metrics.failed == 1


def test_each_call_of_a_hop_sees_its_own_call():
    seen: list[str] = []

    def fn(x: int) -> int:
        call = ember.current_call()
        assert call is not None
        seen.append(call.call_id)
        return x

    runner = Unbatched(fn)
    answers = Answers()
    with ThreadPoolExecutor(1) as pool:
        b = _unbatched(runner, pool, serving=serving("app", "f"))

        async def body() -> None:
            for i in range(5):  # all queued before the batcher's first turn: one hop
                b.submit(answers.call(f"c{i}", i))
            runner.release.set()
            await answers.wait_for(5)

        _run(lambda: _serve(b, body))
    assert seen == [f"c{i}" for i in range(5)]
    assert ember.current_call() is None


def test_a_call_whose_deadline_passes_while_the_hop_runs_is_not_run(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(batcher_module, "RUN_READY_BUDGET_S", 60.0)
    runner = Unbatched()
    answers = Answers()
    with ThreadPoolExecutor(1) as pool:
        b = _unbatched(runner, pool)

        async def body() -> None:
            b.submit(answers.call("first", "first", deadline=time.time() + 0.4))  # earliest deadline: runs first
            b.submit(answers.call("late", "late", deadline=time.time() + 0.5))
            await asyncio.to_thread(runner.started.wait)
            await asyncio.sleep(0.6)  # "late" is in the hop, waiting behind "first", past its deadline
            runner.release.set()
            await answers.wait_for(2)

        _run(lambda: _serve(b, body))
    assert runner.runs == [["first"]]
    assert isinstance(answers.got["late"][1], DeadlineExceededError)
    assert b.metrics.expired == 1


def test_a_call_cancelled_while_its_hop_runs_is_skipped_and_not_answered():
    runner = Unbatched()
    answers = Answers()
    with ThreadPoolExecutor(1) as pool:
        b = _unbatched(runner, pool)

        async def body() -> None:
            for key in ("a", "b", "c"):
                b.submit(answers.call(key, key))
            await asyncio.to_thread(runner.started.wait)  # the hop holds all three; "a" runs
            assert b.cancel("b")
            runner.release.set()
            await answers.wait_for(2)

        _run(lambda: _serve(b, body))
    assert runner.runs == [["a"], ["c"]]
    assert set(answers.got) == {"a", "c"}


def test_a_hop_stops_at_its_budget_and_the_rest_run_next_in_order(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(batcher_module, "RUN_READY_BUDGET_S", 0.0)  # one call per hop
    runner = Unbatched()
    answers = Answers()
    with CountingPool() as pool:
        b = _unbatched(runner, pool)

        async def body() -> None:
            for i in range(6):
                b.submit(answers.call(f"c{i}", i))
            runner.release.set()
            await answers.wait_for(6)

        _run(lambda: _serve(b, body))
        assert pool.hops == 6
    assert runner.runs == [[i] for i in range(6)]
    assert all(answers.got[f"c{i}"] == (i, None, 1) for i in range(6))


def test_batched_functions_and_several_slots_keep_their_batches():
    with ThreadPoolExecutor(2) as pool:
        assert Batcher(lambda xs: xs, max_size=8, window_s=0.0, executor=pool, run_ready=64).run_ready == 1
        assert Batcher(lambda xs: xs, max_size=1, window_s=0.0, executor=pool, run_ready=64, slots=2).run_ready == 1

        async def arun(xs: list[Any]) -> list[Any]:
            return xs

        assert Batcher(arun, max_size=1, window_s=0.0, executor=pool, run_ready=64).run_ready == 1


def test_the_running_fit_is_the_least_squares_fit_of_the_window():
    rng = random.Random(7)
    model = CostModel(window=16)
    window: deque[tuple[int, float]] = deque(maxlen=16)
    for step in range(3000):
        n = rng.choice([1, 1, 1, 2, 8, 32]) if step % 500 else 1
        t = 0.001 + 0.0002 * n + rng.uniform(0, 0.0005)
        model.observe(n, t)
        window.append((n, t))
        if len(window) >= 4:
            a, b = _least_squares(window)
            assert model.fixed_s == pytest.approx(a, rel=1e-6, abs=1e-12)
            assert model.predict(10) == pytest.approx(a + 10 * b, rel=1e-6, abs=1e-12)


def test_a_queue_hands_an_unbatched_function_one_call_at_a_time():
    """A queued call stays in JetStream, cancellable, until it can start (its hop may run more calls from HTTP)."""
    with ThreadPoolExecutor(1) as pool:
        assert _unbatched(lambda xs: xs, pool).vacancy == 1
