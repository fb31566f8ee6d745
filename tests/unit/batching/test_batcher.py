"""The replica's micro-batcher on a real event loop and executor thread, ordered by events (no sleeps)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.lazy import torch

from ember._errors import DeadlineExceededError, EmberError, OverloadedError, RemoteError, UnavailableError
from ember_runtime.batching.batcher import Batcher, Call
from ember_runtime.batching.costmodel import CostModel


class Recorder:
    """Collects each call's answer: key -> (output, error, batch size); fails on a second answer."""

    def __init__(self) -> None:
        self.answers: dict[Any, tuple[Any, EmberError | None, int]] = {}
        self.changed = asyncio.Event()

    def call(self, key: Any, value: Any = None, *, deadline: float | None = None, priority: str = "interactive",
             cost: float = 1.0) -> Call:
        async def answer(output: Any, error: EmberError | None, size: int) -> None:
            assert key not in self.answers, f"call {key} was answered twice"
            self.answers[key] = (output, error, size)
            self.changed.set()

        return Call(key if value is None else value, time.time() + 60 if deadline is None else deadline, answer,
                    call_id=str(key), priority=priority, cost=cost)

    async def wait_for(self, count: int) -> None:
        while len(self.answers) < count:
            self.changed.clear()
            await self.changed.wait()


class Gate:
    """A model whose first batch blocks until released, so that calls pile up behind it."""

    def __init__(self, fn=lambda xs: list(xs)) -> None:
        self.fn = fn
        self.started = threading.Event()
        self.release = threading.Event()
        self.batches: list[list[Any]] = []

    def __call__(self, xs: list[Any]) -> list[Any]:
        self.batches.append(list(xs))
        self.started.set()
        self.release.wait(10)
        return self.fn(xs)


def run(coro_fn) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(), 20))


async def serve(batcher: Batcher, body) -> Any:
    """Run ``body`` beside the batcher's loop, then close it and wait for it to drain."""
    loop = asyncio.create_task(batcher.run_forever())
    try:
        return await body()
    finally:
        batcher.close()
        await loop


def batcher(fn, pool: ThreadPoolExecutor, **kw: Any) -> Batcher:
    opts: dict[str, Any] = {"max_size": 8, "window_s": 0.05, "executor": pool, "name": "f"} | kw
    return Batcher(fn, **opts)


async def _behind_a_held_call(b: Batcher, gate: Gate, rec: Recorder, n: int) -> None:
    """Call 0 runs and holds the model (``gate``); calls 1 to ``n - 1`` come meanwhile; then it is let go and all
    ``n`` are answered."""
    b.submit(rec.call(0))
    await asyncio.to_thread(gate.started.wait)
    for i in range(1, n):
        b.submit(rec.call(i))
    gate.release.set()
    await rec.wait_for(n)


@pytest.fixture
def pool():
    with ThreadPoolExecutor(1) as executor:
        yield executor


def test_calls_that_wait_behind_a_running_batch_share_the_next_ones(pool):
    gate = Gate(lambda xs: [2 * x for x in xs])
    b = batcher(gate, pool)
    rec = Recorder()
    run(lambda: serve(b, lambda: _behind_a_held_call(b, gate, rec, 20)))
    assert [len(x) for x in gate.batches] == [1, 8, 8, 3]  # bounded by max_size
    assert {k: v[0] for k, v in rec.answers.items()} == {i: 2 * i for i in range(20)}  # each its own output
    assert all(rec.answers[k][2] == len(next(x for x in gate.batches if k in x)) for k in range(20))


def test_an_idle_replica_does_not_wait_for_the_window(pool):
    b = batcher(lambda xs: xs, pool, window_s=3600)  # waiting would hang the test past its timeout
    rec = Recorder()

    async def body():
        b.submit(rec.call("only"))
        await rec.wait_for(1)

    run(lambda: serve(b, body))
    assert rec.answers["only"] == ("only", None, 1)


def test_a_lone_call_goes_at_once_even_where_waiting_would_pay(pool):
    # 30 s fixed cost per batch and calls that came back to back: the policy would hold a call for the next one
    # (up to 30 s, past the test's timeout); one call alone with no batch running goes at once, in a batch of one.
    sizes: list[int] = []
    b = batcher(lambda xs: sizes.append(len(xs)) or xs, pool, max_size=2, window_s=3600,
                cost_model=CostModel(a=30.0, b=0.0))
    rec = Recorder()

    async def body():
        b.submit(rec.call("a"))
        b.submit(rec.call("b"))  # a full batch: goes at once
        await rec.wait_for(2)
        b.submit(rec.call("lone"))
        await rec.wait_for(3)

    run(lambda: serve(b, body))
    assert sizes == [2, 1]  # the first two still batched together; the lone one ran by itself
    assert rec.answers["lone"] == ("lone", None, 1)
    assert b.metrics.batch_size.counts[0] == 1  # one batch of size 1 in the histogram


def test_calls_that_keep_arriving_still_fill_a_batch_behind_a_lone_one(pool):
    gate = Gate()
    b = batcher(gate, pool, max_size=4, window_s=3600, cost_model=CostModel(a=30.0, b=0.0))
    rec = Recorder()
    run(lambda: serve(b, lambda: _behind_a_held_call(b, gate, rec, 5)))  # the first, lone, runs at once
    assert [len(x) for x in gate.batches] == [1, 4]


def test_when_waiting_pays_a_batch_waits_for_the_window(pool):
    # A fixed cost of 10 s per batch and calls arriving back to back: waiting for more is worth it.
    b = batcher(lambda xs: xs, pool, window_s=0.05, cost_model=CostModel(a=10.0, b=0.0))
    rec = Recorder()

    async def body():
        b.submit(rec.call("a"))
        b.submit(rec.call("b"))
        await rec.wait_for(2)

    run(lambda: serve(b, body))
    assert rec.answers["a"][2] == rec.answers["b"][2] == 2


def test_a_full_batch_goes_before_the_window_closes(pool):
    b = batcher(lambda xs: xs, pool, max_size=3, window_s=3600, cost_model=CostModel(a=10.0, b=0.0))
    rec = Recorder()

    async def body():
        for key in "abc":
            b.submit(rec.call(key))
        await rec.wait_for(3)

    run(lambda: serve(b, body))
    assert {v[2] for v in rec.answers.values()} == {3}


def test_interactive_calls_go_first_then_earliest_deadline(pool):
    order: list[str] = []
    gate = Gate(lambda xs: order.extend(xs) or xs)
    b = batcher(gate, pool, max_size=1)
    rec = Recorder()
    now = time.time()

    async def body():
        b.submit(rec.call("first"))
        await asyncio.to_thread(gate.started.wait)
        b.submit(rec.call("batch-early", deadline=now + 10, priority="batch"))
        b.submit(rec.call("inter-late", deadline=now + 50))
        b.submit(rec.call("batch-late", deadline=now + 40, priority="batch"))
        b.submit(rec.call("inter-early", deadline=now + 20))
        gate.release.set()
        await rec.wait_for(5)

    run(lambda: serve(b, body))
    assert order == ["first", "inter-early", "inter-late", "batch-early", "batch-late"]


def test_expired_calls_get_a_deadline_error_and_never_run(pool):
    gate = Gate()
    b = batcher(gate, pool)
    rec = Recorder()

    async def body():
        b.submit(rec.call("first"))
        await asyncio.to_thread(gate.started.wait)
        b.submit(rec.call("late", deadline=time.time() - 1))
        b.submit(rec.call("fine"))
        gate.release.set()
        await rec.wait_for(3)

    run(lambda: serve(b, body))
    assert isinstance(rec.answers["late"][1], DeadlineExceededError)
    assert rec.answers["fine"][0] == "fine"
    assert all("late" not in batch for batch in gate.batches)
    assert b.metrics.expired == 1


def test_a_cancelled_call_is_dropped_unanswered(pool):
    gate = Gate()
    b = batcher(gate, pool)
    rec = Recorder()

    async def body():
        b.submit(rec.call("first"))
        await asyncio.to_thread(gate.started.wait)
        b.submit(rec.call("gone"))
        b.submit(rec.call("kept"))
        assert b.cancel("gone") and not b.cancel("gone") and not b.cancel("unknown")
        gate.release.set()
        await rec.wait_for(2)

    run(lambda: serve(b, body))
    assert set(rec.answers) == {"first", "kept"}
    assert all("gone" not in batch for batch in gate.batches)


def test_a_full_queue_refuses_with_the_numbers(pool):
    gate = Gate()
    b = batcher(gate, pool, max_size=1, max_queue=2)
    rec = Recorder()

    async def body():
        b.submit(rec.call(0))
        await asyncio.to_thread(gate.started.wait)
        b.submit(rec.call(1))
        b.submit(rec.call(2))
        with pytest.raises(OverloadedError, match="2/2") as info:
            b.submit(rec.call(3))
        assert info.value.retry_after_s and info.value.retry_after_s >= 1
        gate.release.set()
        await rec.wait_for(3)

    run(lambda: serve(b, body))
    assert b.metrics.rejected == 1


def test_a_call_predicted_to_miss_its_deadline_is_refused_up_front(pool):
    b = batcher(lambda xs: xs, pool, max_size=1, cost_model=CostModel(a=5.0, b=0.0))
    rec = Recorder()

    async def body():
        with pytest.raises(OverloadedError, match="predicted to finish"):
            b.submit(rec.call("hopeless", deadline=time.time() + 1.0))
        b.submit(rec.call("patient", deadline=time.time() + 3600))
        await rec.wait_for(1)

    run(lambda: serve(b, body))
    assert set(rec.answers) == {"patient"}


def test_a_poisoned_input_fails_alone(pool):
    calls: list[int] = []

    def fragile(xs: list[str]) -> list[str]:
        calls.append(len(xs))
        if "bad" in xs:
            raise KeyError("bad input")
        return [x.upper() for x in xs]

    gate = Gate(fragile)
    b = batcher(gate, pool)
    rec = Recorder()
    keys = ["a", "b", "bad", "c", "d", "e", "f", "g"]

    async def body():
        b.submit(rec.call("first"))
        await asyncio.to_thread(gate.started.wait)
        for key in keys:
            b.submit(rec.call(key))
        gate.release.set()
        await rec.wait_for(9)

    run(lambda: serve(b, body))
    error = rec.answers["bad"][1]
    assert isinstance(error, RemoteError) and error.remote_type == "KeyError"
    assert all(rec.answers[k] == (k.upper(), None, 8) for k in keys if k != "bad")
    assert len(calls) <= 2 + 2 * 3  # the first batch, then a bisection: two halves per level


def test_out_of_memory_splits_the_batch_and_remembers_a_safe_size(pool):
    out_of_memory = torch.OutOfMemoryError  # torch imported here, not in the model thread within run()'s 20 s (under
    #                                         the full suite's load that import alone has taken longer)

    def small_gpu(xs: list[int]) -> list[int]:
        if len(xs) > 4:
            raise out_of_memory("CUDA out of memory. Tried to allocate 2.00 GiB")
        return xs

    gate = Gate(small_gpu)
    b = batcher(gate, pool)
    rec = Recorder()

    async def body():
        b.submit(rec.call(-1))
        await asyncio.to_thread(gate.started.wait)
        for i in range(8):
            b.submit(rec.call(i))
        gate.release.set()
        await rec.wait_for(9)
        assert b.capacity == 4
        for i in range(8, 16):
            b.submit(rec.call(i))
        await rec.wait_for(17)

    run(lambda: serve(b, body))
    assert all(rec.answers[i][:2] == (i, None) for i in range(16))
    assert max(len(batch) for batch in gate.batches[-2:]) <= 4  # later batches stay under the safe size


def test_onnx_runtime_allocation_failures_count_as_out_of_memory():
    from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException

    from ember.backends import is_out_of_memory

    assert is_out_of_memory(RuntimeException("Failed to allocate memory for requested buffer of size 1073741824"))
    assert is_out_of_memory(RuntimeException("Available memory of 0 is smaller than requested bytes of 4096"))
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory."))
    assert not is_out_of_memory(ValueError("bad pixel"))


def batches_of_queued(pool, costs: dict[str, float], **kw: Any) -> list[list[Any]]:
    """The batches formed from calls of these costs, all queued while a first call holds the model."""
    gate = Gate()
    b = batcher(gate, pool, **kw)
    rec = Recorder()

    async def body():
        b.submit(rec.call("first"))
        await asyncio.to_thread(gate.started.wait)
        for key, cost in costs.items():
            b.submit(rec.call(key, cost=cost))
        gate.release.set()
        await rec.wait_for(len(costs) + 1)

    run(lambda: serve(b, body))
    return gate.batches[1:]


def test_batches_are_bounded_by_cost(pool):
    costs = {"a": 6, "b": 3, "c": 4, "d": 1, "e": 9}
    assert batches_of_queued(pool, costs, max_cost=10.0) == [["a", "b"], ["c", "d"], ["e"]]


def test_grouped_by_cost_a_batch_takes_the_calls_closest_in_cost_to_the_most_urgent(pool):
    costs = {"s1": 10, "L1": 400, "s2": 12, "L2": 380, "s3": 9, "L3": 420, "s4": 11}
    batches = batches_of_queued(pool, costs, max_size=3, max_cost=2000.0, group_by_cost=True)
    # In deadline order the batches would mix: [s1, L1, s2], [L2, s3, L3], [s4]. Grouped, the most urgent
    # call leads each batch, and the calls nearest its cost join it, nearest first.
    assert batches == [["s1", "s4", "s3"], ["L1", "L3", "L2"], ["s2"]]


def test_an_output_of_the_wrong_length_is_a_clear_error_for_every_call(pool):
    gate = Gate(lambda xs: xs[:-1])
    b = batcher(gate, pool)
    rec = Recorder()

    async def body():
        b.submit(rec.call("first"))
        await asyncio.to_thread(gate.started.wait)
        for i in range(3):
            b.submit(rec.call(i))
        gate.release.set()
        await rec.wait_for(4)

    run(lambda: serve(b, body))
    for key in range(3):
        error = rec.answers[key][1]
        assert isinstance(error, RemoteError) and "2 outputs for 3 inputs" in error.message


def test_close_answers_what_was_queued_then_refuses_new_calls(pool):
    b = batcher(lambda xs: xs, pool, max_size=2)
    rec = Recorder()

    async def main():
        for i in range(5):
            b.submit(rec.call(i))
        b.close()
        with pytest.raises(UnavailableError):
            b.submit(rec.call(99))
        await b.run_forever()

    run(main)
    assert sorted(rec.answers) == [0, 1, 2, 3, 4]


def test_a_hard_stop_fails_the_waiters_with_a_retryable_error(pool):
    b = batcher(lambda xs: xs, pool)
    rec = Recorder()

    async def main():
        for i in range(3):
            b.submit(rec.call(i))
        assert await b.fail_pending(UnavailableError("stopping", retry_after_s=0.1)) == 3

    run(main)
    assert all(isinstance(rec.answers[i][1], UnavailableError) for i in range(3))


def test_model_code_runs_off_the_event_loop(pool):
    threads: list[int] = []
    b = batcher(lambda xs: threads.append(threading.get_ident()) or xs, pool)
    rec = Recorder()

    async def body():
        b.submit(rec.call(0))
        await rec.wait_for(1)
        return threading.get_ident()

    loop_thread = run(lambda: serve(b, body))
    assert threads and threads[0] != loop_thread


def test_metrics_count_batches_sizes_and_waits(pool):
    gate = Gate()
    b = batcher(gate, pool, max_size=4)
    rec = Recorder()

    async def body():
        b.submit(rec.call("first"))
        await asyncio.to_thread(gate.started.wait)
        for i in range(6):
            b.submit(rec.call(i))
        gate.release.set()
        await rec.wait_for(7)

    run(lambda: serve(b, body))
    stats = b.metrics.snapshot("f", b.queued)
    assert (stats.calls, stats.batches) == (7, 3)
    assert stats.batch_size.count == 3 and stats.batch_size.sum == 7
    assert stats.queue_wait_s.count == 7 and stats.run_s.count == 3
    assert stats.fill_ratio == pytest.approx((1 + 4 + 2) / 4 / 3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 1000), st.booleans(), st.sampled_from(["interactive", "batch"]),
                          st.booleans()), min_size=1, max_size=40),
       st.integers(1, 8), st.sampled_from([0.0, 0.001]), st.booleans())
def test_every_call_gets_exactly_one_answer_and_it_is_its_own(pool, calls, max_size, window_s, grouped):
    """Random inputs, costs, priorities, expired calls and poisoned inputs, in deadline order or grouped by
    cost: one answer per call, never crossed."""
    def model(xs: list[tuple[int, bool]]) -> list[int]:
        if any(poison for _, poison in xs):
            raise ValueError("poison")
        return [value * 3 for value, _ in xs]

    b = batcher(model, pool, max_size=max_size, window_s=window_s, max_cost=2000.0, group_by_cost=grouped)
    rec = Recorder()

    async def body():
        for i, (value, poison, priority, expired) in enumerate(calls):
            deadline = time.time() - 1 if expired else None
            b.submit(rec.call(i, (value, poison), deadline=deadline, priority=priority, cost=1 + value))
            if i % 5 == 0:
                await asyncio.sleep(0)  # let some batches form before the rest arrive
        await rec.wait_for(len(calls))

    run(lambda: serve(b, body))
    assert sorted(rec.answers) == list(range(len(calls)))
    for i, (value, poison, _, expired) in enumerate(calls):
        output, error, _ = rec.answers[i]
        if expired:
            assert isinstance(error, DeadlineExceededError)
        elif poison:
            assert isinstance(error, RemoteError) and error.remote_type == "ValueError"
        else:
            assert error is None and output == value * 3
