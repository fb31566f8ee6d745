"""User code that raises ``SystemExit`` (``sys.exit``) or another ``BaseException``: that input's error, isolated like
any other failure, while the replica's event loop, its batcher and its step loops serve on."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from test_batcher import Recorder, run, serve

from ember._errors import RemoteError
from ember.wire.openai import CompletionRequest
from ember_runtime.batching.batcher import Batcher
from ember_runtime.batching.modelthread import ModelThread
from ember_runtime.replica.continuous import StepLoop


class Odd(BaseException):
    """A ``BaseException`` of the user's own."""


def _quits(exc: BaseException):
    def fn(xs: list[Any]) -> list[Any]:
        if "bad" in xs:
            raise exc
        return [f"ok {x}" for x in xs]

    return fn


def _async(fn):
    async def afn(xs: list[Any]) -> list[Any]:
        await asyncio.sleep(0)
        return fn(xs)

    return afn


@pytest.fixture
def model_thread():
    thread = ModelThread()
    yield thread
    thread.shutdown()


@pytest.mark.parametrize("exc", [SystemExit("user code called sys.exit"), SystemExit(0), Odd("odd")])
@pytest.mark.parametrize("is_async", [False, True])
def test_a_batch_that_exits_fails_only_the_input_at_fault_and_the_batcher_serves_on(model_thread, exc, is_async):
    fn = _quits(exc)
    b = Batcher(_async(fn) if is_async else fn, max_size=4, window_s=0.0, executor=model_thread, name="f")
    rec = Recorder()

    async def body():
        for key in ("a", "bad", "c"):  # queued before the loop's first turn: one batch, bisected
            b.submit(rec.call(key))
        await rec.wait_for(3)
        b.submit(rec.call("later"))
        await rec.wait_for(4)

    run(lambda: serve(b, body))
    error = rec.answers["bad"][1]
    assert isinstance(error, RemoteError) and error.remote_type == type(exc).__name__
    assert {k: v[0] for k, v in rec.answers.items() if k != "bad"} == {"a": "ok a", "c": "ok c", "later": "ok later"}


def test_the_model_thread_hands_the_loop_no_exit(model_thread):
    async def main() -> list[BaseException]:
        loop = asyncio.get_running_loop()
        errors = []
        for waiter in (model_thread.call(loop, sys.exit, 3), asyncio.wrap_future(model_thread.submit(sys.exit, 3))):
            try:
                await waiter
            except BaseException as exc:
                errors.append(exc)
        return errors

    errors = asyncio.run(main())
    assert [type(e) for e in errors] == [RuntimeError, RuntimeError]
    assert all(isinstance(e.__cause__, SystemExit) for e in errors)
    assert model_thread.submit(lambda: 42).result(10) == 42  # the thread lives on


def _bad_then_good(raised: Callable[[], BaseException]) -> tuple[BaseException | None, list[str], int]:
    """A step loop whose step raises ``raised()`` for a "bad" prompt: the error of a bad sequence, the pieces of a
    good one after it, and the sequences left running."""
    def step(seqs: list[Any]) -> list[str | None]:
        if any(s.request.prompt == "bad" for s in seqs):
            raise raised()
        return [None for _ in seqs]

    async def main() -> tuple[BaseException | None, list[str], int]:
        steps = StepLoop(step, "gen")
        try:
            failed = None
            try:
                await steps.generate(CompletionRequest(model="m", prompt="bad"), "c1", time.time() + 30, None)
            except BaseException as exc:
                failed = exc
            after = await steps.generate(CompletionRequest(model="m", prompt="good"), "c2", time.time() + 30, None)
            return failed, after, steps.running
        finally:
            steps.close()

    return asyncio.run(asyncio.wait_for(main(), 20))


def test_a_continuous_step_that_exits_fails_its_sequences_and_the_loop_serves_on():
    failed, after, running = _bad_then_good(lambda: SystemExit("the step called sys.exit"))
    assert isinstance(failed, RemoteError) and failed.remote_type == "SystemExit"
    assert after == [] and running == 0


@pytest.mark.parametrize("cancelled", [concurrent.futures.CancelledError, asyncio.CancelledError])
def test_a_continuous_step_that_raises_cancelled_fails_its_sequences_and_the_loop_serves_on(cancelled):
    """A step whose own future was cancelled (``CancelledError`` out of it): before, the step loop took it for its own
    cancellation and ended, its sequences left waiting until their deadlines and counted as running."""
    failed, after, running = _bad_then_good(cancelled)
    assert isinstance(failed, RemoteError) and failed.remote_type == "CancelledError"
    assert after == [] and running == 0
