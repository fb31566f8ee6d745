"""A replica being stopped drains in a task of its own (``agent/drains.py``): a start waits for it only when it needs
what that replica holds, its GPUs or room in the node's host memory. Real processes: each replica is a script that
takes a while to exit after SIGTERM, as a replica draining its calls does."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from ember import _loop as ember_loop
from ember_runtime.agent.drains import Drains
from ember_runtime.agent.numa import HostMemory
from ember_runtime.agent.slots import ReplicaSlot, SlotKey

DRAIN_S = 1.0


def _interpreter(tmp_path: Path) -> Path:
    """The replica's interpreter: runs until SIGTERM, then drains for ``DRAIN_S`` and exits."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ntrap 'sleep {DRAIN_S}; exit 0' TERM\nwhile true; do sleep 0.05; done\n")
    python.chmod(0o755)
    return python


def _slot(tmp_path: Path, name: str, gpus: tuple[str, ...]) -> ReplicaSlot:
    # No NATS here: what a slot publishes (its output, its status) is dropped when it cannot be sent.
    return ReplicaSlot(SlotKey("a", "f", 1, 0, name), nc=None, replicas_kv=None, nats_url="nats://127.0.0.1:1",
                       node_id="n", bundle=tmp_path, module="m", env={}, first_start=("fresh", time.time(), 0.0),
                       python=_interpreter(tmp_path), gpu_uuids=gpus)


async def _stopping(tmp_path: Path, drains: Drains, name: str) -> ReplicaSlot:
    """A replica on GPU-a, running, then given to ``drains`` to stop: it drains for ``DRAIN_S``."""
    slot = _slot(tmp_path, name, ("GPU-a",))
    slot.start()
    while slot.reservation() is None:  # a GPU replica whose process runs
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # its shell has set its trap
    drains.stop(slot)
    return slot


def _run(coro) -> None:
    with asyncio.Runner(loop_factory=ember_loop.loop_factory()) as runner:
        runner.run(coro)


def test_a_start_waits_only_for_the_stopping_replicas_on_its_gpus(tmp_path):
    async def go() -> None:
        drains = Drains(HostMemory(0))
        slot = await _stopping(tmp_path, drains, "r-gpu")
        assert drains.get("r-gpu") is slot and drains.keys == {slot.key}
        started = time.monotonic()
        await drains.room_for("r-other", ("GPU-b",), 0)  # another GPU: at once
        assert drains.get("r-gpu") is slot  # it did not wait for the stopping replica: that one still drains
        await drains.room_for("r-other", ("GPU-b", "GPU-a"), 0)  # one of its GPUs: once it has exited
        assert drains.get("r-gpu") is None and drains.keys == set()
        assert time.monotonic() - started >= DRAIN_S * 0.9

    _run(go())


def test_a_start_whose_host_memory_does_not_fit_waits_for_every_stopping_replica(tmp_path):
    async def go() -> None:
        memory = HostMemory(1000)
        drains = Drains(memory)
        memory.reserve("r-mem", 800)
        await _stopping(tmp_path, drains, "r-mem")
        await drains.room_for("r-other", (), 200)  # fits beside it
        assert memory.reserved_mb == 800 and drains.get("r-mem") is not None  # not waited for: it still drains
        await drains.room_for("r-other", (), 300)  # does not: its memory comes back when it has exited
        assert memory.reserved_mb == 0 and drains.get("r-mem") is None

    _run(go())


def test_a_replica_assigned_again_while_it_drains_starts_once_it_has_exited(tmp_path):
    """One replica id, one process: its status key, its NATS identity and its subjects are the id's."""
    async def go() -> None:
        drains = Drains(HostMemory(0))
        await _stopping(tmp_path, drains, "r-again")
        started = time.monotonic()
        await drains.room_for("r-again", (), 0)
        assert drains.get("r-again") is None and time.monotonic() - started >= DRAIN_S * 0.9

    _run(go())
