"""Per-process GPU memory, read from NVML or from a declared inventory's virtual driver.

A ``UsageSource`` answers one question: on each of these devices (GPU or MIG slice uuids), how many MB
does each process use? ``NvmlUsage`` asks the driver. ``DeclaredUsage`` answers for the devices of a
declared (virtual) inventory, which no driver knows: there a directory plays the driver's process table,
and a process "allocates" by writing an entry ``<table>/<name>`` holding ``{"<device uuid>": MB}`` that it keeps
open while it lives, as a driver's context (a sandboxed replica too: the agent finds the holder's pid on the node;
replicas find the directory in ``EMBER_VIRTUAL_GPU_PROCESSES``); an entry nobody holds belongs to the pid its name
says. Everything after the answer (which processes are a
replica's, what it sums to, whether that breaks its reservation) is one code path for both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections import defaultdict
from collections.abc import Collection, Iterable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ember_runtime.agent.inventory import _optional, _text

log = logging.getLogger("ember.agent")

VIRTUAL_TABLE_ENV = "EMBER_VIRTUAL_GPU_PROCESSES"
Sample = dict[str, dict[int, int]]  # device uuid -> pid -> MB of GPU memory it uses there
_declared = msgspec.json.Decoder(dict[str, int])


class UsageSource(Protocol):
    def sample(self, devices: Collection[str], pids: Collection[int]) -> Sample:
        """Each of ``devices`` this node has, with the GPU memory each process uses on it (MB); ``pids``: the
        processes that are asked about (the node's GPU replicas and theirs), where a driver needs to be told."""
        ...

    def close(self) -> None: ...


class NvmlUsage:
    """The driver's per-process accounting (``usedGpuMemory``), on whole GPUs and on MIG slices."""

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml  # the `gpu` extra; only a node with a driver gets here

            nvml = pynvml
        nvml.nvmlInit()
        self._nvml = nvml
        self._handles: dict[str, Any] = {}

    def sample(self, devices: Collection[str], pids: Collection[int] = ()) -> Sample:
        if not set(devices) <= self._handles.keys():  # first use, or MIG slices were reconfigured
            self._handles = _handles(self._nvml)
        return {uuid: _processes(self._nvml, self._handles[uuid]) for uuid in devices if uuid in self._handles}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()


def _handles(nvml: Any) -> dict[str, Any]:
    """Every GPU and MIG slice by uuid (enumerated, since not every driver resolves a MIG uuid directly)."""
    found: dict[str, Any] = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        gpu = nvml.nvmlDeviceGetHandleByIndex(i)
        found[_text(nvml.nvmlDeviceGetUUID(gpu))] = gpu
        for j in range(_optional(nvml, partial(nvml.nvmlDeviceGetMaxMigDeviceCount, gpu), 0)):
            mig = _optional(nvml, partial(nvml.nvmlDeviceGetMigDeviceHandleByIndex, gpu, j), None)
            if mig is not None:
                found[_text(nvml.nvmlDeviceGetUUID(mig))] = mig
    return found


def _processes(nvml: Any, handle: Any) -> dict[int, int]:
    """MB per pid of the compute processes (and MPS clients) on one device; unknown amounts are left out."""
    compute = _newest(nvml, "nvmlDeviceGetComputeRunningProcesses")
    procs = list(compute(handle))  # an error here is the watch's to report
    mps = _newest(nvml, "nvmlDeviceGetMPSComputeRunningProcesses", None)
    if mps is not None:  # not supported where MPS is not running
        procs += _optional(nvml, partial(mps, handle), [])
    used: dict[int, int] = {}
    for proc in procs:
        if proc.usedGpuMemory is not None:  # None: not available (e.g. no permission to see it)
            used[int(proc.pid)] = max(used.get(int(proc.pid), 0), int(proc.usedGpuMemory) >> 20)
    return used


def _newest(nvml: Any, name: str, *default: Any) -> Any:
    """The ``_v3`` variant where this nvidia-ml-py has it (older ones expose only the plain name)."""
    return getattr(nvml, f"{name}_v3", None) or getattr(nvml, name, *default)


class DeclaredUsage:
    """The virtual driver of a declared inventory: what live processes wrote to ``<table>/<pid>``."""

    def __init__(self, table: Path, devices: Iterable[str]) -> None:
        self.table = table
        self.devices = frozenset(devices)
        table.mkdir(parents=True, exist_ok=True)

    def sample(self, devices: Collection[str], pids: Collection[int] = ()) -> Sample:
        """An entry is the memory of the processes holding it open, as a driver's context is (their pids on this
        node: a sandboxed process knows only its own namespace's); held by none, of the process its name says.
        Only ``pids`` are looked at for holders: reading every process's open files costs seconds on a node of a
        few hundred sandboxes (each one's pasta holds ~430)."""
        sample: Sample = {uuid: {} for uuid in devices if uuid in self.devices}
        entries = [entry for entry in self.table.iterdir() if not entry.name.startswith(".")]  # "." : being written
        if not entries:  # nothing declared: no need to read every process's open files (a node's thousands)
            return sample
        holders = _holders(self.table, pids)  # after the listing: an entry renamed into place meanwhile is seen held
        for entry in entries:
            pids = holders.get(entry.name) or ({int(entry.name)} if entry.name.isdigit() else set())
            pids = {pid for pid in pids if _alive(pid)}
            if not pids:  # the driver frees a process's memory when it exits
                entry.unlink(missing_ok=True)
                continue
            for uuid, mb in _read_declared(entry).items():
                if uuid in sample:  # a process's contexts on a GPU add up, as the driver reports its total
                    used = sample[uuid]
                    for pid in pids:
                        used[pid] = used.get(pid, 0) + mb
        return sample

    def close(self) -> None:
        pass


def _holders(table: Path, pids: Iterable[int], proc: Path = Path("/proc")) -> dict[str, set[int]]:
    """Entry name -> which of ``pids`` have that entry of ``table`` open (read from ``/proc/<pid>/fd``)."""
    held: dict[str, set[int]] = defaultdict(set)
    prefix = f"{table.resolve()}{os.sep}"
    for pid in pids:
        with contextlib.suppress(OSError):  # gone, or not ours to read
            for fd in (proc / str(pid) / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith(prefix):
                        held[target[len(prefix):]].add(pid)
    return held


MAX_DECLARED_BYTES = 64 * 1024  # one entry of the table: a few GPUs' usage


def _read_declared(entry: Path) -> dict[str, int]:
    """One entry, as a plain file of at most ``MAX_DECLARED_BYTES``: the table is a folder replicas write, and an
    entry that is a link (to ``/dev/zero``), a FIFO (never written) or huge held the agent's watch for good."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"not a plain file ({entry.name})")
            data = os.read(fd, MAX_DECLARED_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_DECLARED_BYTES:
            raise OSError(f"over {MAX_DECLARED_BYTES} bytes")
        return _declared.decode(data)
    except (OSError, msgspec.DecodeError) as exc:  # writers rename into place; this one did not
        log.warning("ignoring %s of the virtual GPU process table: %s", entry, exc)
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_trees(roots: Iterable[int], proc: Path = Path("/proc")) -> dict[int, set[int]]:
    """Each root pid with its descendants and the members of its session.

    A replica is a session leader, so a worker that was orphaned (re-parented to init) still counts
    as the replica's through its session.
    """
    children: dict[int, list[int]] = defaultdict(list)
    sessions: dict[int, set[int]] = defaultdict(set)
    for entry in proc.iterdir():
        stat = _stat(entry) if entry.name.isdigit() else None
        if stat is not None:
            children[stat[0]].append(int(entry.name))
            sessions[stat[1]].add(int(entry.name))
    trees: dict[int, set[int]] = {}
    for root in roots:
        tree = {root} | sessions.get(root, set())
        todo = list(tree)
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in tree:
                    tree.add(child)
                    todo.append(child)
        trees[root] = tree
    return trees


def _stat(entry: Path) -> tuple[int, int] | None:
    """(parent pid, session id) of a process, from ``/proc/<pid>/stat``; None once it has gone."""
    try:
        fields = (entry / "stat").read_text().rpartition(")")[2].split()
        return int(fields[1]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return None
