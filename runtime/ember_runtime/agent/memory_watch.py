"""The GPU memory watch: a replica that keeps using more GPU memory than it reserved is restarted.

Replicas that share a GPU by memory reserve a share of it (``SlotAssignment.memory_mb``, per GPU); torch
replicas cap their allocator to it, but nothing stops other allocations, and one replica over its share
can starve its neighbours. Each second the agent samples per-process GPU memory (``gpu_usage``: NVML, or
the virtual driver of a declared inventory), sums it over each replica's process tree, and asks
``MemoryWatch`` (pure, no I/O) which replicas stayed over their reservation for ``STRIKES`` samples in a
row: a single sample may catch a transient peak. Those are killed and restarted by their slot, with an
error event that carries the numbers. Replicas that hold whole GPUs or MIG slices are not held to a
limit (the hardware bounds them), but their use is sampled all the same: the node reports every replica's
use with its heartbeat, for the metrics and the console.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ember_runtime.agent.gpu_usage import UsageSource, process_trees

log = logging.getLogger("ember.agent")

WATCH_EVERY_S = 1.0
STRIKES = 2
# NVML counts the CUDA context and the driver's own allocations, which torch's allocator cap does not.
TOLERANCE_MB = 512
TOLERANCE_SHARE = 0.05
_MB_PER_GB = 1024


@dataclass(frozen=True)
class Reservation:
    """What one running replica process may use: ``memory_mb`` on each of its ``devices``."""

    replica_id: str
    pid: int
    devices: tuple[str, ...]
    memory_mb: int


@dataclass(frozen=True)
class Breach:
    """A replica process that stayed over its reservation on ``device``."""

    replica_id: str
    pid: int
    device: str
    used_mb: int
    reserved_mb: int

    def message(self) -> str:
        return (f"replica {self.replica_id} used {self.used_mb / _MB_PER_GB:.1f} GB of GPU memory on {self.device}, "
                f"reserved {self.reserved_mb / _MB_PER_GB:.1f} GB: restarting")


Usage = Mapping[str, Mapping[str, int]]  # replica id -> device uuid -> MB its process tree uses there


class MemoryWatch:
    """Counts consecutive samples over the limit per replica process; decides, does nothing."""

    def __init__(self, strikes: int = STRIKES, tolerance_mb: int = TOLERANCE_MB,
                 tolerance_share: float = TOLERANCE_SHARE) -> None:
        self.strikes = strikes
        self.tolerance_mb = tolerance_mb
        self.tolerance_share = tolerance_share
        self._over: dict[tuple[str, int], int] = {}  # (replica id, pid): a restarted process starts clean

    def limit_mb(self, reserved_mb: int) -> int:
        return reserved_mb + max(self.tolerance_mb, round(reserved_mb * self.tolerance_share))

    def observe(self, reservations: Iterable[Reservation], usage: Usage) -> list[Breach]:
        """The replicas to restart after this sample; one under its limit (or not sampled) starts over."""
        over: dict[tuple[str, int], int] = {}
        breaches: list[Breach] = []
        for r in reservations:
            worst = self._worst(r, usage.get(r.replica_id, {}))
            if worst is None:
                continue
            key = (r.replica_id, r.pid)
            over[key] = self._over.get(key, 0) + 1
            if over[key] >= self.strikes:
                breaches.append(worst)
                del over[key]
        self._over = over
        return breaches

    def _worst(self, r: Reservation, used: Mapping[str, int]) -> Breach | None:
        """The device where ``r`` is most over its limit, if any."""
        limit = self.limit_mb(r.memory_mb)
        device = max(r.devices, key=lambda d: used.get(d, 0), default=None)
        if device is None or used.get(device, 0) <= limit:
            return None
        return Breach(replica_id=r.replica_id, pid=r.pid, device=device, used_mb=used[device],
                      reserved_mb=r.memory_mb)


def replica_usage(reservations: Iterable[Reservation], sample: Mapping[str, Mapping[int, int]],
                  trees: Mapping[int, set[int]]) -> dict[str, dict[str, int]]:
    """What each replica's process tree uses on each of its devices, in one sample (MB)."""
    usage: dict[str, dict[str, int]] = {}
    for r in reservations:
        tree = trees.get(r.pid, {r.pid})
        usage[r.replica_id] = {d: sum(sample.get(d, {}).get(pid, 0) for pid in tree) for d in r.devices}
    return usage


class Watched(Protocol):
    """A replica slot, as the watch sees it."""

    replica_id: str

    def reservation(self) -> Reservation | None:
        """The running process, its GPUs and what it reserved (``memory_mb`` 0: GPUs held whole, sampled for the
        metrics but not held to a limit); None when it runs nothing on a GPU."""
        ...

    async def restart(self, reason: str, *, pid: int) -> bool:
        """Kill process ``pid`` (if it is still the slot's) so that the slot starts it again."""
        ...


class UsageWatcher:
    """Samples GPU memory every ``every_s`` and restarts the replicas ``MemoryWatch`` picks."""

    def __init__(self, source: UsageSource, slots: Callable[[], Iterable[Watched]], *,
                 watch: MemoryWatch | None = None, every_s: float = WATCH_EVERY_S) -> None:
        self.source = source
        self.slots = slots
        self.watch = watch or MemoryWatch()
        self.every_s = every_s
        self.last_usage: dict[str, dict[str, int]] = {}  # replica id -> device uuid -> MB, as last sampled

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``; a failed sample is logged once per distinct error, and the watch goes on."""
        last_error = ""
        while not stop.is_set():
            try:
                await self.tick()
                last_error = ""
            except Exception as exc:
                if str(exc) != last_error:
                    log.warning("GPU memory watch: cannot sample usage: %s: %s", type(exc).__name__, exc)
                last_error = str(exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)

    async def tick(self) -> list[Breach]:
        """One sample: measure, decide, restart. Returns what broke its reservation."""
        slots = {slot.replica_id: slot for slot in self.slots()}
        processes = [r for slot in slots.values() if (r := slot.reservation()) is not None]
        usage = await asyncio.to_thread(self._measure, processes) if processes else {}
        self.last_usage = usage  # every GPU replica's use, for the node's report (metrics, the console)
        breaches = self.watch.observe([r for r in processes if r.memory_mb], usage)
        for breach in breaches:
            await slots[breach.replica_id].restart(breach.message(), pid=breach.pid)
        return breaches

    def _measure(self, reservations: list[Reservation]) -> dict[str, dict[str, int]]:
        trees = process_trees(r.pid for r in reservations)
        sample = self.source.sample({d for r in reservations for d in r.devices}, set().union(*trees.values()))
        return replica_usage(reservations, sample, trees)
