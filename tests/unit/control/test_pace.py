"""The control loop's pace: a deployment's change brings the next tick forward; no change waits the period."""

from __future__ import annotations

import asyncio

import pytest

from ember_platform.control import pace


def test_a_change_brings_the_tick_forward_and_is_consumed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pace, "TICK_S", 3600.0)  # only the change can end the wait within the test

    async def scenario() -> bool:
        changed = asyncio.Event()
        waiting = asyncio.ensure_future(pace.until_next_tick(changed))
        await asyncio.sleep(0)
        assert not waiting.done()
        changed.set()
        await asyncio.wait_for(waiting, 10)
        return changed.is_set()

    assert asyncio.run(scenario()) is False


def test_a_change_made_during_a_tick_wakes_the_next_wait_at_once(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pace, "TICK_S", 3600.0)

    async def scenario() -> None:
        changed = asyncio.Event()
        changed.set()  # set while the tick ran, before the loop waits again
        await asyncio.wait_for(pace.until_next_tick(changed), 10)

    asyncio.run(scenario())


def test_without_a_change_the_wait_is_the_period(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pace, "TICK_S", 0.01)

    async def scenario() -> bool:
        changed = asyncio.Event()
        await asyncio.wait_for(pace.until_next_tick(changed), 10)
        return changed.is_set()

    assert asyncio.run(scenario()) is False
