"""A sandbox whose start is abandoned (its slot stopped while bwrap was starting it, so the task awaiting
``sandbox.start`` is cancelled) is killed with it: before, the replica it was starting ran on, seen by nobody."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial

import pytest
from support.procs import running

from ember_runtime.agent import reap, sandbox
from ember_runtime.agent.sandbox import Jail, environment


def _running(marker: str) -> list[int]:
    """The sandboxed command's processes (an interpreter whose command line holds ``marker``, not bwrap, whose
    own command line holds it too), not zombies."""
    return running(lambda argv: argv[0] == sys.executable.encode() and any(marker.encode() in a for a in argv))


def _abandon(node_sandbox, jail: Jail, cancelled: Callable[[], None] = lambda: None) -> None:
    """Start a sandbox running a marked command, cancel the start once the command runs: nothing of it runs on,
    and its process's transport is closed (an unclosed one warns when collected: a failure here)."""
    marker = f"abandoned-{uuid.uuid4().hex}"
    started = asyncio.Event()

    async def scenario() -> None:
        code = f"import time; time.sleep(120)  # {marker}"
        starting = asyncio.create_task(sandbox.start(
            node_sandbox, [sys.executable, "-c", code], jail, environment({}, sandboxed=True),
            partial(sandbox.prepare_child, None)))
        deadline = time.monotonic() + 10
        while not _running(marker) and time.monotonic() < deadline:  # bwrap started the command
            await asyncio.sleep(0.02)
        assert _running(marker), "the sandboxed command never started"
        started.set()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        cancelled()

    asyncio.run(scenario())
    assert started.is_set()
    deadline = time.monotonic() + 10
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(marker) == []
    gc.collect()


def test_a_sandbox_whose_start_is_cancelled_does_not_run_on(node_sandbox, tmp_path, monkeypatch):
    read_all = sandbox._read_all

    def slow_read(fd: int) -> bytes:  # the window in which the slot may be stopped, widened
        time.sleep(1.0)
        return read_all(fd)

    monkeypatch.setattr(sandbox, "_read_all", slow_read)
    (tmp_path / "bundle").mkdir()
    _abandon(node_sandbox, Jail(bundle=tmp_path / "bundle"))


def test_a_zygotes_sandbox_is_killed_though_bwrap_never_said_which_process_it_was(node_sandbox, tmp_path,
                                                                                  monkeypatch):
    """A zygote's command outlives bwrap (no --die-with-parent). Before, the sandbox's first process was known
    only from bwrap's --info-fd: where that came too late (a loaded node), the abandoned zygote ran on, holding
    its output pipes open."""
    read_all = sandbox._read_all
    said = threading.Event()

    def late_read(fd: int) -> bytes:  # bwrap's word arrives once the discard has given up waiting for it
        said.wait(60)
        return read_all(fd)

    monkeypatch.setattr(sandbox, "_read_all", late_read)
    monkeypatch.setattr(reap, "WAIT_S", 0.5)
    (tmp_path / "bundle").mkdir()
    try:
        _abandon(node_sandbox, Jail(bundle=tmp_path / "bundle", outlive_command=True), said.set)
    finally:
        said.set()


def test_a_sandbox_cancelled_while_asyncio_spawns_it_is_killed(node_sandbox, tmp_path, monkeypatch):
    """The cancel may come while ``create_subprocess_exec`` itself is under way (bwrap forked, its pipes being
    connected). Before, asyncio's clean-up killed bwrap alone: a zygote's command, which outlives bwrap, ran on
    unseen, holding its output open."""
    spawn = asyncio.create_subprocess_exec

    async def slow_spawn(*args, **kwargs):  # the window in which the slot may be stopped, widened
        proc = await spawn(*args, **kwargs)
        await asyncio.sleep(2.0)
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", slow_spawn)
    (tmp_path / "bundle").mkdir()
    _abandon(node_sandbox, Jail(bundle=tmp_path / "bundle", outlive_command=True))
