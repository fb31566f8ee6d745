"""pasta is attached to a sandbox's network namespace only once bwrap has set the sandbox up and waits on its
``--block-fd``: bwrap adds 127.0.0.1 to the namespace's loopback itself (refusing an address already there), and
pasta brings that loopback up, which adds it. Attached as soon as bwrap said the sandbox's pid, pasta sometimes
came first on a loaded node, and the sandbox died with "bwrap: loopback: Failed RTM_NEWADDR" (seen in CI, as an
image build's failure and as replicas that never became ready)."""

from __future__ import annotations

import asyncio
import sys
from functools import partial
from pathlib import Path

from support import doors

from ember_runtime.agent import netns, sandbox
from ember_runtime.agent.sandbox import Jail, environment


def test_pasta_attaches_once_the_sandbox_waits_for_it(networked, tmp_path, monkeypatch):
    seen: list[str] = []
    attach = netns.attach

    async def observed(network, pid, *, blocked):  # what bwrap's first process does as pasta is attached
        seen.append(Path(f"/proc/{pid}/wchan").read_text())
        return await attach(network, pid, blocked=blocked)

    monkeypatch.setattr(netns, "attach", observed)
    (tmp_path / "bundle").mkdir()

    async def run() -> None:
        for _ in range(5):
            proc = await sandbox.start(networked, [sys.executable, "-c", "pass"], Jail(bundle=tmp_path / "bundle"),
                                       environment({}, sandboxed=True), partial(sandbox.prepare_child, None))
            await proc.stdout.read()
            assert await proc.wait() == 0
        assert await doors.until_closed() == []

    asyncio.run(run())
    assert len(seen) == 5 and all("pipe" in wchan for wchan in seen), seen  # blocked reading --block-fd
