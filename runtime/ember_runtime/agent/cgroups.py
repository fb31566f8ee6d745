"""Per-replica memory limits (the function's ``memory=``) through cgroup v2, where the node lets the agent
use them: its own cgroup delegated to it (writable) with the memory controller available. Each replica gets
a child cgroup with ``memory.max``; the process joins it before it runs anything (a fresh one between fork
and exec, a forked one before it is told to go on). Where the node does not allow it, replicas run without
a memory limit and the agent says so once, at start."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("ember.agent")
AGENT_LEAF = "agent"  # where the agent moves itself: a cgroup with children may hold no process


@dataclass(frozen=True)
class Decision:
    root: Path | None  # the agent's cgroup, under which replicas get theirs; None: no limits
    reason: str  # why not, when root is None
    move_agent: bool = False  # the memory controller must first be enabled for children, the agent moved out


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
    return Decision(root, "", move_agent="memory" not in subtree.split())


class MemoryCgroups:
    def __init__(self, decision: Decision) -> None:
        self.root = decision.root
        self.reason = decision.reason

    @classmethod
    def for_agent(cls) -> MemoryCgroups:
        """Look once; enable the memory controller for children where needed; say once why not."""
        mount, own = _cgroup2_mount(), _own_cgroup()
        root = mount / own.lstrip("/") if mount is not None and own else None
        decision = decide(mount, own, _read(root, "cgroup.controllers"), _read(root, "cgroup.subtree_control"),
                          root is not None and os.access(root, os.W_OK))
        if decision.root is not None and decision.move_agent:
            try:
                leaf = decision.root / AGENT_LEAF
                leaf.mkdir(exist_ok=True)
                (leaf / "cgroup.procs").write_text(str(os.getpid()))
                (decision.root / "cgroup.subtree_control").write_text("+memory")
            except OSError as exc:
                decision = Decision(None, f"cannot enable the memory controller in {decision.root}: {exc}")
        if decision.root is None:
            log.warning("replicas run without memory limits: %s", decision.reason)
        return cls(decision)

    def prepare(self, name: str, memory_mb: int) -> Path | None:
        """A cgroup for one replica limited to ``memory_mb``; None where limits are unavailable or none is asked."""
        if self.root is None or memory_mb <= 0:
            return None
        group = self.root / name
        try:
            group.mkdir(exist_ok=True)
            (group / "memory.max").write_text(str(memory_mb * 1024 * 1024))
            with contextlib.suppress(OSError):
                (group / "memory.swap.max").write_text("0")
        except OSError as exc:
            log.warning("no memory limit for %s: %s", name, exc)
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


def _own_cgroup() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    return ""


def _cgroup2_mount() -> Path | None:
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
