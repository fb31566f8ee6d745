"""A fresh replica's lifeline (a FIFO whose write end its agent holds): the replica serves on while no agent holds
it, stops if none comes back within the grace, and forgets the absence when one does."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from ember_runtime import lifeline


def _fifo(tmp_path: Path) -> tuple[int, int]:
    path = tmp_path / "lifeline"
    os.mkfifo(path, 0o600)
    read = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    return read, os.open(path, os.O_WRONLY | os.O_NONBLOCK)


def test_no_agent_within_the_grace_stops_the_replica(tmp_path: Path) -> None:
    read, write = _fifo(tmp_path)

    async def go() -> None:
        stop = asyncio.Event()
        watch = lifeline.watch(stop, {lifeline.LIFELINE_ENV: str(read)}, grace_s=0.1)
        assert watch is not None
        assert lifeline.agent_present(read)
        os.close(write)  # the agent died
        assert not lifeline.agent_present(read)
        await asyncio.wait_for(watch, 30)
        assert stop.is_set()

    asyncio.run(go())


def test_an_agent_back_within_the_grace_keeps_the_replica(tmp_path: Path) -> None:
    read, write = _fifo(tmp_path)

    async def go() -> None:
        stop = asyncio.Event()
        grace_s = lifeline.CHECK_EVERY_S * 4
        watch = lifeline.watch(stop, {lifeline.LIFELINE_ENV: str(read)}, grace_s=grace_s)
        assert watch is not None
        os.close(write)
        await asyncio.sleep(lifeline.CHECK_EVERY_S * 1.2)  # seen gone once
        again = os.open(tmp_path / "lifeline", os.O_WRONLY | os.O_NONBLOCK)  # a restarted agent adopts it
        assert lifeline.agent_present(read)
        await asyncio.sleep(grace_s * 1.5)  # past the grace since it was seen gone: it would have stopped by now
        assert not stop.is_set() and not watch.done()
        stop.set()  # its own SIGTERM: the watch ends with it
        await asyncio.wait_for(watch, 30)
        os.close(again)

    asyncio.run(go())


def test_without_a_lifeline_nothing_is_watched() -> None:
    async def go() -> None:
        assert lifeline.watch(asyncio.Event(), {}) is None
        assert lifeline.watch(asyncio.Event(), {lifeline.LIFELINE_ENV: "not-a-number"}) is None
        assert lifeline.watch(asyncio.Event(), {lifeline.LIFELINE_ENV: "987654"}) is None  # no such descriptor

    asyncio.run(go())
