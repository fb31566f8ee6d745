"""GPU faults: a GPU its driver reports a critical Xid error for is taken out of service.

NVIDIA's driver reports hardware and driver faults as Xid errors (NVML's ``XidCriticalError`` events). Those that
are an application's own doing leave the GPU in service, as NVIDIA's Kubernetes device plugin leaves them: 13
(graphics engine exception), 31 (memory page fault), 43 (a channel stopped), 45 (preemptive clean-up after those),
68 (video processor exception) and 109 (context switch timeout); the agent's ``--ignore-xids`` adds to them, or
ignores all. Any other (48 double-bit ECC, 63 and 64 row remapping, 74 NVLink, 79 fallen off the bus, 94 and 95 ECC
errors, 119 and 120 GSP, ...) puts the GPU, with its MIG slices, out of service until the agent starts again (once
the operator has reset or replaced it): the node reports the device with ``fault`` set, the scheduler places nothing
more on it, and the control plane moves the replicas on it to other GPUs, each leaving once its replacement serves.

Two sources answer "which Xid errors came?", through the same decision after: ``NvmlXids`` waits on the driver's
events, and ``DeclaredXids`` reads the virtual driver of a declared inventory, a file of ``<device uuid> <xid>``
lines that the operator (or a test) appends to, in the agent's state directory, which no sandbox sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import msgspec

from ember.wire import Device
from ember_runtime.agent.inventory import _text

log = logging.getLogger("ember.agent")

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})  # the application's fault, not the GPU's
ALL = None  # ``ignored_xids("all")``: no Xid takes a GPU out of service, and none is watched
WAIT_S = 1.0  # how long one wait for the driver's events lasts (the watch checks for its stop between waits)
_MAX_LINE = 256  # a longer line of the virtual driver's file is not an event


class Xid(NamedTuple):
    uuid: str  # the GPU's (a MIG slice's event names its GPU)
    xid: int


class XidSource(Protocol):
    def wait(self, timeout_s: float) -> list[Xid]:
        """The Xid errors reported since the last call, waiting up to ``timeout_s`` for one (blocking)."""
        ...

    def close(self) -> None: ...


class GpuFaults:
    """The decision: which GPUs are out of service and why, from the Xid errors reported (pure; one per agent)."""

    def __init__(self, ignored: Iterable[int] = APPLICATION_XIDS) -> None:
        self.ignored = frozenset(ignored)
        self.last_xid: dict[str, int] = {}  # GPU uuid -> the last Xid reported for it, of any kind
        self.faults: dict[str, str] = {}  # GPU uuid -> why it is out of service ("Xid 79 at 12:00:00 UTC")

    def record(self, event: Xid, now: float | None = None) -> str:
        """Takes one reported error; the reason when it puts its GPU out of service now, else ""."""
        self.last_xid[event.uuid] = event.xid
        if event.xid in self.ignored or event.uuid in self.faults:
            return ""
        at = time.strftime("%H:%M:%S UTC", time.gmtime(time.time() if now is None else now))
        self.faults[event.uuid] = f"Xid {event.xid} at {at}"
        return self.faults[event.uuid]

    def apply(self, devices: Iterable[Device]) -> list[Device]:
        """``devices`` as the node reports them: each GPU (and each MIG slice of one) with its last Xid and fault."""
        def gpu(d: Device) -> str:
            return d.parent_uuid or d.uuid

        return [msgspec.structs.replace(d, xid=self.last_xid.get(gpu(d), 0), fault=self.faults.get(gpu(d), ""))
                if d.kind == "gpu" and gpu(d) in self.last_xid else d for d in devices]


def ignored_xids(text: str) -> frozenset[int] | None:
    """The agent's ``--ignore-xids``: Xids that leave a GPU in service besides an application's own, as numbers
    separated by commas ("" for none); "all" (``ALL``): none takes a GPU out of service. ``ValueError`` saying what
    is wrong otherwise."""
    if text.strip().lower() == "all":
        return ALL
    numbers = [part.strip() for part in text.split(",") if part.strip()]
    if bad := [n for n in numbers if not _number(n)]:
        raise ValueError(f"{bad[0]!r} is not an Xid (a whole number): give numbers separated by commas, or 'all'")
    return APPLICATION_XIDS | {int(n) for n in numbers}


def source_for(devices: Iterable[Device], declared: Path | None) -> XidSource | None:
    """Where this node's Xid errors are read: ``declared``, the virtual driver's file of a declared inventory, else
    NVML; None on a node without GPUs, or where NVML cannot be used (said)."""
    gpus = [d.uuid for d in devices if d.kind == "gpu" and d.uuid and not d.parent_uuid]
    if not gpus:
        return None
    if declared is not None:
        return DeclaredXids(declared, gpus)
    try:
        return NvmlXids()
    except Exception as exc:
        log.warning("GPU faults are not watched: NVML is unavailable: %s", exc)
        return None


async def watch(source: XidSource, faults: GpuFaults, stop: asyncio.Event, on_change: Callable[[], None]) -> None:
    """Records what ``source`` reports until ``stop``; ``on_change`` after each error (the node reports at once)."""
    while not stop.is_set():
        try:
            events = await asyncio.to_thread(source.wait, WAIT_S)
        except Exception as exc:  # the driver's wait failed: tried again, not a fault of any one GPU
            log.warning("GPU Xid errors are not read: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 30.0)
            continue
        for event in events:
            if why := faults.record(event):
                log.error("GPU %s reported %s: out of service until this agent restarts; its replicas move to other "
                          "GPUs", event.uuid, why)
            elif event.uuid in faults.faults:
                log.warning("GPU %s reported Xid %d (out of service already)", *event)
            else:
                log.warning("GPU %s reported Xid %d (an application's error: it stays in service)", *event)
        if events:
            on_change()


class DeclaredXids:
    """The virtual driver of a declared inventory: ``path`` holds ``<device uuid> <xid>`` lines, appended to; each
    line is read once. Only the declared GPUs count; a line that is not an event is skipped, and said."""

    def __init__(self, path: Path, gpus: Iterable[str]) -> None:
        self._path = path
        self._gpus = frozenset(gpus)
        self._offset = 0
        self._stop = False

    def wait(self, timeout_s: float) -> list[Xid]:
        deadline = time.monotonic() + timeout_s
        while True:
            events = self._read()
            if events or time.monotonic() >= deadline or self._stop:
                return events
            time.sleep(min(0.1, timeout_s))

    def _read(self) -> list[Xid]:
        try:
            with self._path.open("rb") as file:
                file.seek(self._offset)
                data = file.read(1 << 20)
        except FileNotFoundError:
            return []
        whole = data[:data.rfind(b"\n") + 1]  # a line still being written is read when it ends
        self._offset += len(whole)
        events = []
        for line in whole.splitlines():
            fields = line.decode(errors="replace").split() if len(line) <= _MAX_LINE else []
            if len(fields) == 2 and fields[0] in self._gpus and _number(fields[1]):
                events.append(Xid(fields[0], int(fields[1])))
            elif line.strip():
                log.warning("%s: skipped a line that is not '<declared GPU uuid> <xid>': %r", self._path, line[:80])
        return events

    def close(self) -> None:
        self._stop = True


class NvmlXids:
    """The driver's ``XidCriticalError`` events for every GPU of the node (a GPU that cannot report them is said
    once and not watched)."""

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml  # the `gpu` extra; only a node with a driver gets here

            nvml = pynvml
        nvml.nvmlInit()
        self._nvml = nvml
        self._set = nvml.nvmlEventSetCreate()
        self._uuids: dict[Any, str] = {}  # device handle's address -> the GPU's uuid
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._set)
            except nvml.NVMLError as exc:
                log.warning("GPU %s cannot report Xid errors (%s): its faults are not watched", uuid, exc)
                continue
            self._uuids[_address(handle)] = uuid

    def wait(self, timeout_s: float) -> list[Xid]:
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait_v2(self._set, int(timeout_s * 1000))
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                return []
            raise
        if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
            return []
        uuid = self._uuids.get(_address(data.device))
        if uuid is None:  # no handle of ours: the driver lost track of which GPU (every watched GPU is suspect)
            return [Xid(u, int(data.eventData)) for u in self._uuids.values()]
        return [Xid(uuid, int(data.eventData))]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlEventSetFree(self._set)
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 6


def _address(handle: Any) -> Any:
    """A device handle as a key: NVML hands out the same pointer for a device, wrapped anew each time."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle  # not a ctypes pointer: a stand-in for the driver
