"""A sandbox whose own set-up fails (bwrap's child dies before it waits for pasta) is reported with bwrap's words:
before, the start failed naming the network (``/proc/<pid>/ns/user`` missing, as pasta's routes were added),
which said nothing of what went wrong (seen in CI, as an image build's failure)."""

from __future__ import annotations

import asyncio
import sys
from functools import partial
from pathlib import Path

import pytest
from support import doors

from ember_runtime.agent import sandbox
from ember_runtime.agent.sandbox import Jail, environment


def test_a_sandbox_that_cannot_be_set_up_says_what_bwrap_said(networked, tmp_path):
    (tmp_path / "bundle").mkdir()
    missing = tmp_path / "not-there"
    jail = Jail(bundle=tmp_path / "bundle", readonly=(missing,))

    async def start() -> None:
        await sandbox.start(networked, [sys.executable, "-c", "print('never')"], jail,
                            environment({}, sandboxed=True), partial(sandbox.prepare_child, None))

    with pytest.raises(sandbox.SandboxFailed) as failed:
        asyncio.run(start())
    assert str(missing) in str(failed.value)  # bwrap: "Can't find source path ...: No such file or directory"
    assert "before its command began" in str(failed.value)


def test_a_sandbox_that_can_be_set_up_runs_and_its_door_closes_after_it(networked, tmp_path):
    (tmp_path / "bundle").mkdir()

    async def run() -> tuple[bytes, list[Path]]:
        proc = await sandbox.start(networked, [sys.executable, "-c", "print('ran')"], Jail(bundle=tmp_path / "bundle"),
                                   environment({}, sandboxed=True), partial(sandbox.prepare_child, None))
        out = await proc.stdout.read()
        assert await proc.wait() == 0
        return out, await doors.until_closed()  # closed as the loop sees the sandbox end

    assert asyncio.run(run()) == (b"ran\n", [])
