"""Which relayed calls a caller's cancel ends, on a real event loop: those filed under it then, and those filed after
(a request on its way as the cancel came), for as long and as many as the control plane remembers cancels; a batch's
call only once every call the batch serves is cancelled."""

from __future__ import annotations

import asyncio
import time

import pytest

from ember_platform.calls.lineage import Lineage


async def _relayed(lineage: Lineage, app: str, *call_ids: str) -> str:
    """A relayed call's task, as the relay serves it: how it ended."""
    try:
        with lineage.made_by(app, *call_ids):
            await asyncio.sleep(5)
        return "ran"
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not lineage.was_cancelled(task):
            raise  # the wait for it ended
        assert task is not None
        task.uncancel()  # as the relay does: it answers "cancelled" and goes on
        return "cancelled"


def _run_after_cancels(lineage: Lineage, cancels: list[tuple[str, str]], made_by: tuple[str, ...]) -> str:
    """How a call made by ``made_by`` ends once ``cancels`` came (TimeoutError: still running after 0.3s)."""
    async def main() -> str:
        for app, call_id in cancels:
            lineage.cancel(app, call_id)
        return await asyncio.wait_for(_relayed(lineage, *made_by), 0.3)
    return asyncio.run(main())


def test_a_call_filed_before_its_callers_cancel_is_cancelled() -> None:
    async def main() -> str:
        lineage = Lineage()
        task = asyncio.create_task(_relayed(lineage, "a", "c1"))
        await asyncio.sleep(0.01)
        assert lineage.cancel("a", "c1") == 1
        return await asyncio.wait_for(task, 2)
    assert asyncio.run(main()) == "cancelled"


def test_a_call_filed_after_its_callers_cancel_is_cancelled_at_once() -> None:
    """At once: the call sleeps 5 s and is waited for 0.3 s (past it, ``_run_after_cancels`` raises)."""
    assert _run_after_cancels(Lineage(), [("a", "c1")], ("a", "c1")) == "cancelled"


@pytest.mark.parametrize("made_by", [("a", "c2"), ("b", "c1"), ("a", "")])
def test_another_callers_cancel_ends_no_call(made_by: tuple[str, str]) -> None:
    lineage = Lineage()
    with pytest.raises(TimeoutError):  # still running when the wait ends
        _run_after_cancels(lineage, [("a", "c1")], made_by)


def test_the_oldest_cancel_is_forgotten_past_the_bound() -> None:
    lineage = Lineage(remembered=2)
    cancels = [("a", "c1"), ("a", "c2"), ("a", "c3")]
    with pytest.raises(TimeoutError):
        _run_after_cancels(lineage, cancels, ("a", "c1"))
    assert _run_after_cancels(lineage, [], ("a", "c2")) == "cancelled"


def test_a_cancel_is_forgotten_after_a_while() -> None:
    lineage = Lineage(remember_s=0.05)
    lineage.cancel("a", "c1")
    time.sleep(0.1)
    with pytest.raises(TimeoutError):
        _run_after_cancels(lineage, [], ("a", "c1"))


def test_a_batchs_call_is_cancelled_once_every_call_it_serves_is() -> None:
    async def main() -> list[str]:
        lineage = Lineage()
        ended: list[str] = []

        async def relayed() -> None:
            try:
                with lineage.made_by("a", "x", "y"):
                    await asyncio.sleep(5)
            except asyncio.CancelledError:
                ended.append("cancelled")

        task = asyncio.create_task(relayed())
        await asyncio.sleep(0.01)
        assert lineage.cancel("a", "x") == 0  # y still waits on it
        await asyncio.sleep(0.05)
        ended.append("after x")
        assert lineage.cancel("a", "y") == 1
        await asyncio.wait_for(task, 2)
        return ended
    assert asyncio.run(main()) == ["after x", "cancelled"]


def test_a_batchs_call_made_after_some_of_its_calls_were_cancelled_waits_for_the_rest() -> None:
    lineage = Lineage()
    with pytest.raises(TimeoutError):
        _run_after_cancels(lineage, [("a", "x")], ("a", "x", "y"))
    assert _run_after_cancels(lineage, [("a", "y")], ("a", "x", "y")) == "cancelled"


def test_a_spawn_is_refused_once_every_call_its_code_serves_was_cancelled() -> None:
    """A spawn holds no call: the relay asks whether all the calls the spawning code serves were cancelled."""
    lineage = Lineage()
    lineage.cancel("a", "c1")
    assert lineage.all_cancelled("a", ["c1"])
    assert not lineage.all_cancelled("a", ["c1", "c2"])  # a batch runs on for c2
    assert not lineage.all_cancelled("b", ["c1"]) and not lineage.all_cancelled("a", [])
    lineage.cancel("a", "c2")
    assert lineage.all_cancelled("a", ["c1", "c2"])
