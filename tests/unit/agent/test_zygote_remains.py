"""A stopped zygote leaves nothing running: its sandbox ends once the replicas forked from it are gone, and its cgroup
(where the node allows one) with it.

Before, a zygote's stop signalled the zygote process alone, and it ran in the agent's own cgroup: a daemon its snap
setup left in a session of its own kept bwrap's first process (the sandbox's pid namespace) alive for good, and with
it the sandbox's network and the device nodes of its GPUs, with no memory or process limit but the agent's."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from support.procs import running

from ember.wire import ZygoteAssignment
from ember_runtime.agent import cgroups, reap, sandbox
from ember_runtime.agent.cgroups import MemoryCgroups
from ember_runtime.agent.sandbox import Jail, Sandbox, environment
from ember_runtime.agent.zygote_pool import ZygotePool
from ember_runtime.agent.zygote_remains import Remains

APP = '''
import subprocess

import ember

app = ember.App("{app}")


@app.model()
class Snap:
    @ember.setup(snap=True)
    def load(self) -> None:  # a daemon in a session of its own, which the zygote's stop does not reach
        subprocess.Popen(["sleep", "{marker}"], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @ember.method
    def ping(self) -> bool:
        return True
'''
WITHIN_S = 20.0  # not a speed bound: what is left either ends or never does


def _marker() -> str:
    return f"{random.randint(10_000, 99_999)}.{random.randint(100, 999)}"  # seconds of sleep, unique to the test


def _sleeping(marker: str) -> list[int]:
    """Running ``sleep marker`` processes (not zombies)."""
    return running(lambda argv: argv[:2] == [b"sleep", marker.encode()])


async def _until(condition: Callable[[], bool], within_s: float = WITHIN_S) -> bool:
    deadline = asyncio.get_running_loop().time() + within_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _kill(*markers: str) -> None:
    """What a failed test left (by number: these are this test's own processes, seen just now)."""
    for marker in markers:
        for pid in _sleeping(marker):
            os.kill(pid, signal.SIGKILL)


def _build_then_remove(pool: ZygotePool, tmp_path: Path, marker: str,
                       check: Callable[[int], None] = lambda pid: None) -> list[int]:
    """Build a zygote whose snap setup leaves a daemon, ``check`` its pid, remove it: what of the daemon runs on."""
    app = f"zr-{uuid.uuid4().hex[:8]}"
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "leaves_daemon.py").write_text(APP.format(app=app, marker=marker))
    assignment = ZygoteAssignment(app=app, service="Snap", version=1, bundle_sha256="0" * 64, module="leaves_daemon",
                                  host_memory_mb=512)

    async def scenario() -> list[int]:
        await pool.reconcile({(app, "Snap", 1): (assignment, bundle)})
        assert await pool.get(app, "Snap", 1, wait_s=120) is not None, pool.statuses()
        assert await _until(lambda: bool(_sleeping(marker)))
        check(pool.statuses()[0].pid)
        await asyncio.wait_for(pool.reconcile({}), WITHIN_S)  # the scheduler took it away (app deleted, GPUs moved)
        await _until(lambda: not _sleeping(marker))
        left = _sleeping(marker)
        await pool.stop()
        return left

    try:
        return asyncio.run(scenario())
    finally:
        _kill(marker)


def test_a_removed_zygotes_sandbox_ends_with_what_its_setup_left_running(node_sandbox: Sandbox,
                                                                          tmp_path: Path) -> None:
    marker = _marker()
    pool = ZygotePool(tmp_path / "s", "nats://127.0.0.1:1", sandbox_=node_sandbox)
    assert _build_then_remove(pool, tmp_path, marker) == []


def test_a_zygotes_sandbox_outlives_it_until_the_replicas_forked_from_it_are_gone(node_sandbox: Sandbox) -> None:
    """Its forked replicas live in its pid namespace: the sandbox ends after the last of them, not before."""
    replica, daemon = _marker(), _marker()
    command = ["sh", "-c", f"setsid sleep {replica} </dev/null & setsid sleep {daemon} </dev/null & exec sleep 600"]

    async def scenario() -> None:
        jail = Jail(bundle=Path("/tmp"), outlive_command=True)
        env = environment({}, {"PATH": os.defpath}, sandboxed=True)
        proc = await sandbox.start(node_sandbox, command, jail, env, partial(sandbox.prepare_child, None))
        remains = Remains(proc.pid, None)
        assert await _until(lambda: bool(_sleeping(replica)) and bool(_sleeping(daemon)))
        (forked,) = _sleeping(replica)
        remains.forked(forked)
        proc.send_signal(signal.SIGTERM)  # the zygote stopped (and, here, all of its group)
        ending = asyncio.create_task(remains.end())
        await asyncio.sleep(1.0)
        assert not ending.done() and _sleeping(replica) and _sleeping(daemon) and reap.running(proc.pid)
        os.kill(forked, signal.SIGKILL)  # the last forked replica ends
        await asyncio.wait_for(ending, WITHIN_S)
        assert await _until(lambda: not _sleeping(daemon), 5.0) and not reap.running(proc.pid)
        await proc.wait()

    try:
        asyncio.run(scenario())
    finally:
        _kill(replica, daemon)


def _delegated() -> MemoryCgroups:
    """The cgroups this test process may give a zygote (its own cgroup v2, delegated, controllers on for children),
    or a skip that says why not (it never moves itself, as the agent does, to turn them on)."""
    mount, own = cgroups.cgroup2_mount(), cgroups.own_cgroup()
    root = mount / own.lstrip("/") if mount is not None and own else None
    writable = root is not None and os.access(root, os.W_OK)
    decision = cgroups.decide(mount, own, cgroups._read(root, "cgroup.controllers"),
                              cgroups._read(root, "cgroup.subtree_control"), writable)
    if decision.root is None:
        pytest.skip(f"no cgroup for a zygote here: {decision.reason}")
    if decision.move_agent or not decision.pids or "pids" not in cgroups._read(root, "cgroup.subtree_control"):
        pytest.skip(f"the memory and pids controllers are not on for the children of {root}")
    return MemoryCgroups(decision)


def test_a_zygote_runs_in_a_cgroup_of_its_own_that_ends_with_it(tmp_path: Path) -> None:
    """Without a sandbox too: what its setup left in its cgroup is killed with the cgroup."""
    groups = _delegated()
    seen: list[str] = []

    def check(pid: int) -> None:
        line = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if x.startswith("0::"))
        group = groups.root / Path(line[3:]).name  # type: ignore[operator]
        seen.append(str(group))
        assert group.name.startswith("zygote-") and (group / "pids.max").read_text().strip() == str(cgroups.PIDS_MAX)
        assert (group / "memory.max").read_text().strip() == str(512 * 1024 * 1024)  # its service's memory=

    pool = ZygotePool(tmp_path / "s", "nats://127.0.0.1:1", cgroups=lambda: groups)
    assert _build_then_remove(pool, tmp_path, _marker(), check) == []
    assert seen and not Path(seen[0]).exists()
