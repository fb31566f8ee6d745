"""A sandbox whose start is abandoned (its slot stopped while bwrap was starting it, so the task awaiting
``sandbox.start`` is cancelled) is killed with it: before, the replica it was starting ran on, seen by nobody."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from functools import partial
from pathlib import Path

import pytest

from ember_runtime.agent import sandbox
from ember_runtime.agent.sandbox import Jail, environment


def _running(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (not zombies)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(pid))
    return found


def test_a_sandbox_whose_start_is_cancelled_does_not_run_on(node_sandbox, tmp_path, monkeypatch):
    marker = f"abandoned-{uuid.uuid4().hex}"
    read_all = sandbox._read_all
    started = asyncio.Event()

    def slow_read(fd: int) -> bytes:  # the window in which the slot may be stopped, widened
        time.sleep(1.0)
        return read_all(fd)

    monkeypatch.setattr(sandbox, "_read_all", slow_read)
    (tmp_path / "bundle").mkdir()

    async def scenario() -> None:
        code = f"import time; time.sleep(120)  # {marker}"
        starting = asyncio.create_task(sandbox.start(
            node_sandbox, [sys.executable, "-c", code], Jail(bundle=tmp_path / "bundle"),
            environment({}, sandboxed=True), partial(sandbox.prepare_child, None)))
        deadline = time.monotonic() + 10
        while not _running(marker) and time.monotonic() < deadline:  # bwrap started the command
            await asyncio.sleep(0.02)
        assert _running(marker), "the sandboxed command never started"
        started.set()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting

    asyncio.run(scenario())
    assert started.is_set()
    deadline = time.monotonic() + 10
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(marker) == []
