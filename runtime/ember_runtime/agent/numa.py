"""Host locality: a replica's CPU threads on the NUMA node of its GPU, and the host memory replicas reserve.

A host's NUMA topology (node id -> CPU ids) comes from sysfs (``/sys/devices/system/node/node*/cpulist``)
or is declared by a virtual inventory (``[[numa]]``); both give the same ``Topology`` and take one code
path. A replica is pinned only where the topology has several nodes (on one node pinning changes
nothing), and only to CPUs this process may run on: a declared node whose CPUs do not exist here is
logged and skipped, never an error. Pinning happens in the child before ``exec``, so every thread the
replica ever starts inherits it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger("ember.agent")

SYSFS_NODES = Path("/sys/devices/system/node")
# Math libraries that size their thread pools from the machine, not from the CPUs a process may use.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
_MAX_CPU = 1 << 16

Topology = dict[int, frozenset[int]]  # NUMA node -> the CPUs on it


def parse_cpulist(text: str) -> frozenset[int]:
    """CPU ids from the kernel's list format (``"0-3,8,10-11"``); ``ValueError`` says which part is wrong."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part.strip():
            continue
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not a CPU id or range such as '0-15'") from None
        if not 0 <= first <= last < _MAX_CPU:
            raise ValueError(f"{part.strip()!r} is not a CPU range from 0 to {_MAX_CPU - 1}")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpulist(cpus: frozenset[int] | set[int]) -> str:
    """The kernel's list format, as ``/proc/<pid>/status`` shows ``Cpus_allowed_list``."""
    ranges: list[str] = []
    for cpu in sorted(cpus):
        if ranges and cpu == int(ranges[-1].rpartition("-")[2]) + 1:
            ranges[-1] = f"{ranges[-1].partition('-')[0]}-{cpu}"
        else:
            ranges.append(str(cpu))
    return ",".join(ranges)


def read_topology(root: Path = SYSFS_NODES) -> Topology:
    """This host's NUMA nodes that have CPUs; ``{}`` where sysfs does not say (not Linux, or hidden)."""
    nodes: Topology = {}
    for path in sorted(root.glob("node[0-9]*/cpulist")):
        try:
            cpus = parse_cpulist(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("cannot read NUMA node CPUs from %s: %s", path, exc)
            continue
        if cpus:  # a memory-only node (CXL, say) holds no GPU's threads
            nodes[int(path.parent.name.removeprefix("node"))] = cpus
    return nodes


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity, which a cpuset or taskset may narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset()


class Pinning(NamedTuple):
    cpus: frozenset[int] | None  # None: leave the replica unpinned
    why: str  # for the agent's log
    warn: bool = False  # the topology names CPUs this host cannot give: worth an operator's look


def pinning(topology: Topology, node: int, allowed: frozenset[int]) -> Pinning:
    """Where a replica whose GPUs sit on NUMA ``node`` (-1: unknown or split) should run."""
    if len(topology) < 2:
        return Pinning(None, "one NUMA node: not pinned")
    if node < 0:
        return Pinning(None, "its GPUs' NUMA node is unknown or split: not pinned")
    declared = topology.get(node)
    if not declared:
        return Pinning(None, f"NUMA node {node} is not in this host's topology "
                             f"(nodes {', '.join(map(str, sorted(topology)))}): not pinned", warn=True)
    usable = declared & allowed
    if not usable:
        return Pinning(None, f"the CPUs of NUMA node {node} ({format_cpulist(declared)}) do not exist here or "
                             f"are not allowed (this agent may use {format_cpulist(allowed) or 'none'}): not pinned",
                       warn=True)
    partly = f" (of {format_cpulist(declared)}; the rest is not allowed here)" if usable != declared else ""
    return Pinning(usable, f"pinned to NUMA node {node}: CPUs {format_cpulist(usable)}{partly}")


def thread_env(cpus: frozenset[int] | None, environ: Mapping[str, str]) -> dict[str, str]:
    """Thread pool sizes that match the pinned CPUs, for the variables the operator did not set."""
    if not cpus:
        return {}
    return {var: str(len(cpus)) for var in THREAD_ENV_VARS if var not in environ}


class HostMemory:
    """Host memory the node's replicas reserved, counted against the node's RAM (0: RAM unknown)."""

    def __init__(self, total_mb: int) -> None:
        self.total_mb = total_mb
        self._held: dict[str, int] = {}

    @property
    def reserved_mb(self) -> int:
        return sum(self._held.values())

    def reserve(self, replica_id: str, memory_mb: int) -> bool:
        """Count ``replica_id``'s reservation; ``False`` when the node's RAM is now over-committed."""
        self._held[replica_id] = max(memory_mb, 0)
        return not self.total_mb or self.reserved_mb <= self.total_mb

    def release(self, replica_id: str) -> None:
        self._held.pop(replica_id, None)

    def summary(self) -> str:
        total = f"{self.total_mb} MB" if self.total_mb else "an unknown amount"
        return f"host memory: {self.reserved_mb} MB of {total} reserved by {len(self._held)} replicas"
