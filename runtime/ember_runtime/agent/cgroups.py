"""Per-replica memory limits (the function's ``memory=``) through cgroup v2, where the node lets the agent
use them: its own cgroup delegated to it (writable) with the memory controller available. Each replica gets
a child cgroup with ``memory.max``; the process joins it before it runs anything (a fresh one between fork
and exec, a forked one before it is told to go on). Where the node does not allow it, replicas run without
a memory limit and the agent says so once, at start.

The same cgroup bounds the replica's processes (``pids.max``) where the pids controller is available too:
``RLIMIT_NPROC`` counts every process of the user, and every tenant's replicas on a node run as the same user,
so one app's fork bomb would stop every other app's forks. Where it is not, the agent says so once, and the
node's status carries the note."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("ember.agent")
AGENT_LEAF = "agent"  # where the agent moves itself: a cgroup with children may hold no process
PIDS_MAX = 4096  # processes and threads one replica may hold at once


@dataclass(frozen=True)
class Decision:
    root: Path | None  # the agent's cgroup, under which replicas get theirs; None: no limits
    reason: str  # why not, when root is None
    move_agent: bool = False  # the memory controller must first be enabled for children, the agent moved out
    pids: bool = False  # the pids controller is available too: each replica's processes are bounded


def decide(mount: Path | None, own: str, controllers: str, subtree: str, writable: bool) -> Decision:
    """Whether replicas can get memory limits, from what the node shows: the cgroup2 mount point, the agent's
    own cgroup path (``/proc/self/cgroup``'s ``0::`` line), that cgroup's ``cgroup.controllers`` and
    ``cgroup.subtree_control``, and whether the agent may write there."""
    if mount is None or not own:
        return Decision(None, "this node has no cgroup v2 hierarchy")
    root = mount / own.lstrip("/")
    if "memory" not in controllers.split():
        return Decision(None, f"the memory controller is not available in {root} (cgroup v1, or not delegated)")
    if not writable:
        return Decision(None, f"{root} is not writable by the agent (not delegated to it)")
    return Decision(root, "", move_agent="memory" not in subtree.split(), pids="pids" in controllers.split())


class MemoryCgroups:
    def __init__(self, decision: Decision) -> None:
        self.root = decision.root
        self.reason = decision.reason
        self.pids = decision.root is not None and decision.pids
        self.pids_reason = "" if self.pids else \
            decision.reason or f"the pids controller is not available in {decision.root}"

    @classmethod
    def for_agent(cls) -> MemoryCgroups:
        """Look once; enable the memory controller for children where needed; say once why not."""
        mount, own = cgroup2_mount(), own_cgroup()
        root = mount / own.lstrip("/") if mount is not None and own else None
        decision = decide(mount, own, _read(root, "cgroup.controllers"), _read(root, "cgroup.subtree_control"),
                          root is not None and os.access(root, os.W_OK))
        if decision.root is not None and decision.move_agent:
            try:
                leaf = decision.root / AGENT_LEAF
                leaf.mkdir(exist_ok=True)
                (leaf / "cgroup.procs").write_text(str(os.getpid()))
                (decision.root / "cgroup.subtree_control").write_text("+memory +pids" if decision.pids else "+memory")
            except OSError as exc:
                decision = Decision(None, f"cannot enable the memory controller in {decision.root}: {exc}")
        if decision.root is None:
            log.warning("replicas run without memory limits: %s", decision.reason)
        groups = cls(decision)
        if groups.pids and groups.root is not None and "pids" not in _read(groups.root, "cgroup.subtree_control"):
            try:
                (groups.root / "cgroup.subtree_control").write_text("+pids")
            except OSError as exc:
                groups.pids, groups.pids_reason = False, f"cannot enable the pids controller in {groups.root}: {exc}"
        if not groups.pids:
            log.warning("replicas' processes are bounded only by RLIMIT_NPROC, shared by every app on this node: "
                        "%s", groups.pids_reason)
        return groups

    def prepare(self, name: str, memory_mb: int) -> Path | None:
        """A cgroup for one replica limited to ``memory_mb`` (when asked) and to ``PIDS_MAX`` processes (where the
        node allows it); None where neither applies."""
        if self.root is None or (memory_mb <= 0 and not self.pids):
            return None
        group = self.root / name
        try:
            group.mkdir(exist_ok=True)
            if self.pids:
                (group / "pids.max").write_text(str(PIDS_MAX))
            if memory_mb > 0:
                (group / "memory.max").write_text(str(memory_mb * 1024 * 1024))
                with contextlib.suppress(OSError):
                    (group / "memory.swap.max").write_text("0")
        except OSError as exc:
            log.warning("no memory or process limit for %s: %s", name, exc)
            return None
        return group

    @staticmethod
    def joiner(group: Path | None) -> Callable[[], None] | None:
        """For ``preexec_fn``: the new process joins ``group`` (its children then start in it)."""
        if group is None:
            return None
        procs = str(group / "cgroup.procs")

        def join() -> None:
            with contextlib.suppress(OSError), open(procs, "w") as f:
                f.write("0")  # "0": the writing process itself

        return join

    @staticmethod
    def move(group: Path | None, pid: int) -> None:
        if group is not None:
            with contextlib.suppress(OSError):
                (group / "cgroup.procs").write_text(str(pid))

    @staticmethod
    def remove(group: Path | None) -> None:
        if group is not None:
            with contextlib.suppress(OSError):
                group.rmdir()  # once its processes are gone

    @staticmethod
    async def end(group: Path | None, within_s: float) -> None:
        """SIGKILL every process left in ``group`` (``cgroup.kill``, Linux 5.14), then remove it once they are gone
        (``within_s`` at most: a group whose processes outlive that stays)."""
        if group is None:
            return
        with contextlib.suppress(OSError):
            (group / "cgroup.kill").write_text("1")
        deadline = asyncio.get_running_loop().time() + within_s
        while "populated 1" in _read(group, "cgroup.events") and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        MemoryCgroups.remove(group)


def own_cgroup() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    return ""


def cgroup2_mount() -> Path | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split(" - ")
            if len(fields) == 2 and fields[1].split()[0] == "cgroup2":
                return Path(fields[0].split()[4])
    return None


def _read(root: Path | None, name: str) -> str:
    if root is None:
        return ""
    try:
        return (root / name).read_text()
    except OSError:
        return ""
