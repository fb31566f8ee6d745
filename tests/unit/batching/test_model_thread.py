"""The replica's model thread: one thread for the setup and every batch, its short hand-over to the batcher, and its
shutdown."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from ember_runtime.batching.batcher import Batcher, Call
from ember_runtime.batching.modelthread import ModelThread


@pytest.fixture
def model_thread():
    thread = ModelThread()
    yield thread
    thread.shutdown(wait=True)


def test_setup_and_batches_share_one_thread_that_is_not_the_loop(model_thread: ModelThread):
    seen: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(model_thread, lambda: seen.append(threading.current_thread().name))  # the setup
        batcher = Batcher(lambda xs: seen.append(threading.current_thread().name) or xs, max_size=4, window_s=0.0,
                          executor=model_thread, name="f")
        task = asyncio.create_task(batcher.run_forever())
        answered = asyncio.Event()
        outputs: list[object] = []

        async def answer(output: object, error: object, size: int) -> None:
            outputs.append((output, error, size))
            answered.set()

        batcher.submit(Call("x", time.time() + 30, answer, call_id="c1"))
        await asyncio.wait_for(answered.wait(), 10)
        batcher.close()
        await task
        assert outputs == [("x", None, 1)]

    asyncio.run(main())
    assert seen == ["ember-model", "ember-model"]
    assert threading.main_thread().name not in seen


def test_a_call_returns_its_result_or_raises_its_exception_in_the_callers_context(model_thread: ModelThread):
    where = contextvars.ContextVar("where", default="unset")

    def read(_: object) -> str:
        return where.get()

    def fail(_: object) -> None:
        raise ValueError("boom")

    async def main() -> tuple[str, str]:
        loop = asyncio.get_running_loop()
        where.set("caller")
        got = await model_thread.call(loop, contextvars.copy_context().run, read, None)
        with pytest.raises(ValueError, match="boom"):
            await model_thread.call(loop, fail, None)
        submitted = await asyncio.wrap_future(model_thread.submit(lambda: "via submit"))
        return got, submitted

    assert asyncio.run(main()) == ("caller", "via submit")


def test_shutdown_cancels_what_is_queued_and_refuses_more(model_thread: ModelThread):
    release = threading.Event()
    started = threading.Event()

    def block() -> str:
        started.set()
        release.wait(10)
        return "ran"

    running = model_thread.submit(block)
    started.wait(10)
    queued = model_thread.submit(lambda: "never")
    model_thread.shutdown(wait=False, cancel_futures=True)
    release.set()
    assert running.result(10) == "ran"
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        model_thread.submit(lambda: None)
