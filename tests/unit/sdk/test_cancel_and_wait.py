"""``ember._loop.cancel_and_wait``: a component's stop cancels its background tasks and waits for them, cancelling
again a task that lost its cancellation (as Python 3.11's ``asyncio.wait_for`` loses one that comes in the same turn
as its result) and carried on."""

from __future__ import annotations

import asyncio
import contextlib

from ember._loop import cancel_and_wait


def test_a_task_that_lost_its_cancellation_is_cancelled_again_and_ended():
    steps: list[str] = []

    async def loop_that_carries_on() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # lost, as wait_for loses it
            await asyncio.sleep(60)
        steps.append("carried on")
        try:
            await asyncio.sleep(60)
        finally:
            steps.append("ended")

    async def run() -> bool:
        task = asyncio.ensure_future(loop_that_carries_on())
        await asyncio.sleep(0)
        stopping = asyncio.ensure_future(cancel_and_wait(task, None))
        await asyncio.wait({stopping}, timeout=30)  # not wait_for: its own cancel would end the task
        return stopping.done() and task.cancelled()

    assert asyncio.run(run())
    assert steps == ["carried on", "ended"]


def test_tasks_that_end_at_once_and_their_errors_are_retrieved():
    async def fails() -> None:
        raise RuntimeError("boom")

    async def run() -> list[bool]:
        failed = asyncio.ensure_future(fails())
        sleeping = asyncio.ensure_future(asyncio.sleep(60))
        await asyncio.sleep(0)
        await cancel_and_wait(failed, sleeping)  # raises nothing: the error is the task's, retrieved here
        return [failed.done(), sleeping.cancelled()]

    assert asyncio.run(run()) == [True, True]
