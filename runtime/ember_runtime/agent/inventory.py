"""The node's inventory: GPUs (with MIG slices, NVLink peers, NUMA nodes) as wire ``Device``s.

Two sources give the same ``list[Device]``, so that everything downstream takes one code path:

- **NVML** (``from_nvml``): the real GPUs, read through ``nvidia-ml-py``; ``[]`` without a driver.
- **A declared inventory** (``parse`` / ``load(path)``): a TOML file, so that placement, packing and
  topology can be tested and simulated on any machine.

``load(path_or_none)`` is what an agent calls: the declared file when given one, otherwise NVML, and
the CPU as one device where there is no GPU.

The declared format (every key but ``model`` is optional; unknown keys are errors)::

    # GPUs of different [[gpu]] entries joined by NVLink: groups of indices, each fully connected.
    # (Top-level keys come before the first table, as TOML requires.)
    nvlink = [[0, 1]]

    [host]
    name = "node-a"        # prefix of the synthesized uuids: GPU-node-a-0, MIG-node-a-3-0 (default "virtual")
    cpu_cores = 64
    memory_gb = 512        # host memory
    cpu_name = "AMD EPYC"  # the name of the CPU device when no GPU is declared

    [[gpu]]                # indices are given in order of declaration, `count` at a time
    model = "H100-80GB"    # reported as the device name; memory_gb defaults to its "<N>GB" part
    count = 2
    nvlink = true          # the GPUs of this entry are NVLink-connected to each other
    numa_node = 0

    [[gpu]]
    model = "NVIDIA A10G"
    memory_gb = 24
    memory_used_gb = 2     # reported free memory is memory_gb - memory_used_gb
    utilization = 0.3      # 0..1
    numa_node = 1

    [[gpu]]
    model = "A100-80GB"
    mig = { "1g.10gb" = 7 }   # MIG mode, with these slices (profile = count), in order
    numa_node = 1

    [[numa]]               # the host's NUMA nodes and their CPUs (default: this machine's, from sysfs);
    node = 0               # replicas are pinned to their GPU's node, where its CPUs exist on this machine
    cpus = "0-31"
    [[numa]]
    node = 1
    cpus = "32-63"

A MIG slice is a ``Device`` with ``kind="gpu"``, its GPU's ``index``, ``mig_profile`` and
``parent_uuid``, and the name NVML gives it (``"<GPU name> MIG <profile>"``); its GPU is reported
too, with ``mig_enabled=True``.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec

from ember.wire import Device
from ember_runtime.agent.devices import cpu_device
from ember_runtime.agent.numa import Topology, parse_cpulist

log = logging.getLogger("ember.inventory")

T = TypeVar("T")
_MB_PER_GB = 1024
_MIG_PROFILE = re.compile(r"(?:\d+c\.)?(\d+)g\.(\d+)gb(?:\+[a-z0-9]+)?")
_MODEL_MEMORY = re.compile(r"(\d+)GB", re.IGNORECASE)
_MIG_COMPUTE_SLICES = 7


class InventoryError(ValueError):
    """A declared inventory file that cannot be used; the message names the file, line and field."""


class HostInfo(NamedTuple):
    cpu_cores: int  # 0: unknown
    memory_mb: int  # 0: unknown


class _Host(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str = "virtual"
    cpu_cores: int = 0
    memory_gb: float = 0
    cpu_name: str = ""


class _Gpu(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: str
    memory_gb: float | None = None
    count: int = 1
    nvlink: bool = False
    numa_node: int = -1
    mig: dict[str, int] = {}
    memory_used_gb: float = 0
    utilization: float = 0.0


class _Numa(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    node: int
    cpus: str  # the kernel's list format: "0-15,32-47"


class _File(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    nvlink: list[list[int]] = []
    host: _Host = msgspec.field(default_factory=_Host)
    gpu: list[_Gpu] = []
    numa: list[_Numa] = []


# --- one entry point -----------------------------------------------------------------------------


def load(path: str | Path | None) -> list[Device]:
    """The node's devices: from the declared file at ``path``, else from NVML, else the CPU."""
    if path is not None:
        return parse(Path(path).read_text(), source=str(path))
    return from_nvml() or [cpu_device()]


def load_host(path: str | Path | None) -> HostInfo:
    """The host's CPU cores and memory: declared in ``[host]``, else read from this machine."""
    if path is not None:
        host = _decode(Path(path).read_text(), str(path)).host
        return HostInfo(host.cpu_cores, round(host.memory_gb * _MB_PER_GB))
    return HostInfo(os.cpu_count() or 0, cpu_device().memory_total_mb)


def load_numa(path: str | Path | None) -> Topology | None:
    """The NUMA nodes a declared inventory gives in ``[[numa]]``; ``None``: read this machine's."""
    if path is None:
        return None
    spec = _decode(Path(path).read_text(), str(path))
    return {numa.node: parse_cpulist(numa.cpus) for numa in spec.numa} or None


# --- the declared inventory ----------------------------------------------------------------------


def parse(text: str, *, source: str = "<inventory>") -> list[Device]:
    """The devices a declared inventory (TOML text) describes; ``InventoryError`` if it is invalid."""
    spec = _decode(text, source)
    devices = _declared_devices(spec)
    return devices or [_declared_cpu(spec.host)]


def _decode(text: str, source: str) -> _File:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"at line (\d+)", str(exc))
        raise InventoryError(f"{source}{':' + line.group(1) if line else ''}: not valid TOML: {exc}") from exc
    try:
        spec = msgspec.convert(data, _File)
    except msgspec.ValidationError as exc:
        raise _error(text, source, *_split_msgspec_error(str(exc))) from exc
    problem = _first_problem(spec)
    if problem is not None:
        raise _error(text, source, *problem)
    return spec


def _split_msgspec_error(message: str) -> tuple[str, str]:
    text, _, path = message.partition(" - at `")
    path = path.rstrip("`") or "$"
    unknown = re.search(r"unknown field `([^`]+)`", text)
    if unknown:
        path = f"{path}.{unknown.group(1)}"
    return path, text


def _error(text: str, source: str, path: str, problem: str) -> InventoryError:
    line = _line_of(text, path)
    where = f"{source}:{line}" if line else source
    field = path.removeprefix("$.") if path != "$" else "(top level)"
    return InventoryError(f"{where}: {field}: {problem}")


def _line_of(text: str, path: str) -> int | None:
    """The line of a field given as ``$.gpu[2].count``, ``$.host.name`` or ``$.nvlink[0][1]``."""
    m = re.fullmatch(r"\$\.(\w+)(?:\[(\d+)\])*(?:\.(\w+))?", path)
    if not m:
        return None
    table, index, key = m.group(1), int(m.group(2) or 0), m.group(3)
    lines = text.splitlines()
    header = {"gpu": r"\[\[\s*gpu\s*\]\]", "numa": r"\[\[\s*numa\s*\]\]", "host": r"\[\s*host\s*\]"}.get(table)
    if header is None:  # a top-level key
        return _find_key(lines, 0, table)
    starts = [i for i, line in enumerate(lines) if re.match(rf"\s*{header}", line)]
    if index >= len(starts):
        return None
    return (_find_key(lines, starts[index] + 1, key) if key else None) or starts[index] + 1


def _find_key(lines: list[str], start: int, key: str) -> int | None:
    for i in range(start, len(lines)):
        if re.match(r"\s*\[", lines[i]):
            return None
        if re.match(rf"\s*\"?{re.escape(key)}\"?\s*=", lines[i]):
            return i + 1
    return None


def _first_problem(spec: _File) -> tuple[str, str] | None:
    for i, gpu in enumerate(spec.gpu):
        problem = _gpu_problem(gpu)
        if problem is not None:
            return f"$.gpu[{i}].{problem[0]}", problem[1]
    if spec.host.cpu_cores < 0 or spec.host.memory_gb < 0:
        return "$.host.cpu_cores" if spec.host.cpu_cores < 0 else "$.host.memory_gb", "must be >= 0"
    return _nvlink_problem(spec.nvlink, sum(g.count for g in spec.gpu)) or _numa_problem(spec)


def _numa_problem(spec: _File) -> tuple[str, str] | None:
    seen: set[int] = set()
    for i, numa in enumerate(spec.numa):
        if numa.node < 0 or numa.node in seen:
            return f"$.numa[{i}].node", f"a NUMA node is a distinct id >= 0, got {numa.node}"
        seen.add(numa.node)
        try:
            cpus = parse_cpulist(numa.cpus)
        except ValueError as exc:
            return f"$.numa[{i}].cpus", str(exc)
        if not cpus:
            return f"$.numa[{i}].cpus", "lists no CPU; give them as '0-15,32-47'"
    for i, gpu in enumerate(spec.gpu):
        if seen and gpu.numa_node >= 0 and gpu.numa_node not in seen:
            return f"$.gpu[{i}].numa_node", f"NUMA node {gpu.numa_node} is not declared in [[numa]]"
    return None


def _gpu_problem(gpu: _Gpu) -> tuple[str, str] | None:
    memory = _memory_gb(gpu)
    checks: list[tuple[bool, str, str]] = [
        (memory is None, "memory_gb", f"missing, and the model name {gpu.model!r} has no '<N>GB' part to take it from"),
        (memory is not None and memory <= 0, "memory_gb", f"must be > 0, got {memory}"),
        (not 1 <= gpu.count <= 64, "count", f"must be from 1 to 64, got {gpu.count}"),
        (gpu.numa_node < -1, "numa_node", f"must be >= 0 (or -1 for unknown), got {gpu.numa_node}"),
        (not 0 <= gpu.utilization <= 1, "utilization", f"is a share from 0 to 1, got {gpu.utilization}"),
        (not 0 <= gpu.memory_used_gb <= (memory or 0), "memory_used_gb",
         f"must be from 0 to memory_gb ({memory}), got {gpu.memory_used_gb}"),
    ]
    for failed, field, problem in checks:
        if failed:
            return field, problem
    return _mig_problem(gpu.mig, memory or 0)


def _mig_problem(mig: dict[str, int], memory_gb: float) -> tuple[str, str] | None:
    slices = memory = 0
    for profile, count in mig.items():
        m = _MIG_PROFILE.fullmatch(profile)
        if not m:
            return "mig", f"{profile!r} is not a MIG profile such as '1g.10gb' or '3g.40gb'"
        if count < 1:
            return "mig", f"{profile!r} = {count}: a slice count is >= 1"
        slices, memory = slices + int(m.group(1)) * count, memory + int(m.group(2)) * count
    if slices > _MIG_COMPUTE_SLICES:
        return "mig", f"the slices use {slices} compute slices; a GPU has {_MIG_COMPUTE_SLICES}"
    if memory > memory_gb:
        return "mig", f"the slices hold {memory} GB; the GPU has {memory_gb:g} GB"
    return None


def _nvlink_problem(groups: list[list[int]], gpus: int) -> tuple[str, str] | None:
    for i, group in enumerate(groups):
        if len(set(group)) < 2:
            return f"$.nvlink[{i}]", f"a group links at least two distinct GPU indices, got {group}"
        bad = [g for g in group if not 0 <= g < gpus]
        if bad:
            return f"$.nvlink[{i}]", f"no GPU with index {bad[0]}; the file declares indices 0 to {gpus - 1}"
    return None


def _memory_gb(gpu: _Gpu) -> float | None:
    if gpu.memory_gb is not None:
        return gpu.memory_gb
    m = _MODEL_MEMORY.search(gpu.model)
    return float(m.group(1)) if m else None


def _declared_devices(spec: _File) -> list[Device]:
    peers = _declared_peers(spec)
    entries = [gpu for gpu in spec.gpu for _ in range(gpu.count)]
    return [device for index, gpu in enumerate(entries) for device in _declared_gpu(spec.host.name, index, gpu, peers)]


def _declared_peers(spec: _File) -> dict[int, set[int]]:
    groups = [list(g) for g in spec.nvlink]
    start = 0
    for gpu in spec.gpu:
        if gpu.nvlink and gpu.count > 1:
            groups.append(list(range(start, start + gpu.count)))
        start += gpu.count
    peers: dict[int, set[int]] = {}
    for group in groups:
        for a in group:
            peers.setdefault(a, set()).update(b for b in group if b != a)
    return peers


def _declared_gpu(host: str, index: int, gpu: _Gpu, peers: dict[int, set[int]]) -> list[Device]:
    total = round((_memory_gb(gpu) or 0) * _MB_PER_GB)
    parent = Device(kind="gpu", index=index, name=gpu.model, memory_total_mb=total, uuid=f"GPU-{host}-{index}",
                    memory_free_mb=total - round(gpu.memory_used_gb * _MB_PER_GB), utilization=gpu.utilization,
                    mig_enabled=bool(gpu.mig), nvlink_peers=sorted(peers.get(index, ())), numa_node=gpu.numa_node)
    profiles = [p for p, count in gpu.mig.items() for _ in range(count)]
    return [parent] + [_declared_slice(parent, f"MIG-{host}-{index}-{j}", p) for j, p in enumerate(profiles)]


def _declared_slice(parent: Device, uuid: str, profile: str) -> Device:
    m = _MIG_PROFILE.fullmatch(profile)
    memory = int(m.group(2)) * _MB_PER_GB if m else 0
    return _slice(parent, uuid, profile, memory, memory)


def _slice(parent: Device, uuid: str, profile: str, total_mb: int, free_mb: int | None) -> Device:
    return Device(kind="gpu", index=parent.index, name=f"{parent.name} MIG {profile}", memory_total_mb=total_mb,
                  uuid=uuid, memory_free_mb=free_mb, mig_profile=profile, parent_uuid=parent.uuid,
                  numa_node=parent.numa_node)


def _declared_cpu(host: _Host) -> Device:
    cores = f" ({host.cpu_cores} cores)" if host.cpu_cores else ""
    memory = round(host.memory_gb * _MB_PER_GB)
    return Device(kind="cpu", index=0, name=(host.cpu_name or "virtual CPU") + cores, memory_total_mb=memory)


# --- NVML ----------------------------------------------------------------------------------------


def from_nvml(nvml: Any = None) -> list[Device]:
    """The GPUs NVML reports (``nvml``: the ``pynvml`` module, or a stand-in); ``[]`` without a driver."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return []
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return []
    try:
        return _nvml_devices(nvml)
    except nvml.NVMLError as exc:
        log.warning("NVML found a driver but failed to list GPUs: %s", exc)
        return []
    finally:
        nvml.nvmlShutdown()


def _nvml_devices(nvml: Any) -> list[Device]:
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    buses = [_optional(nvml, partial(_pci_bus, nvml, h), None) for h in handles]
    peers = _nvml_peers(nvml, handles, buses)
    devices: list[Device] = []
    for i, handle in enumerate(handles):
        gpu = _nvml_gpu(nvml, i, handle, peers.get(i, set()), buses[i])
        devices.append(gpu)
        if gpu.mig_enabled:
            devices.extend(_nvml_slices(nvml, handle, gpu))
    return devices


def _nvml_gpu(nvml: Any, index: int, handle: Any, peers: set[int], bus: tuple[int, ...] | None) -> Device:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    mode = _optional(nvml, lambda: nvml.nvmlDeviceGetMigMode(handle)[0], 0)
    return Device(kind="gpu", index=index, name=_text(nvml.nvmlDeviceGetName(handle)),
                  memory_total_mb=int(memory.total) >> 20, uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                  memory_free_mb=int(memory.free) >> 20,
                  utilization=_optional(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100, 0.0),
                  mig_enabled=mode == nvml.NVML_DEVICE_MIG_ENABLE, nvlink_peers=sorted(peers),
                  numa_node=_numa(nvml, handle, bus))


def _numa(nvml: Any, handle: Any, bus: tuple[int, ...] | None) -> int:
    node = _optional(nvml, lambda: int(nvml.nvmlDeviceGetNumaNodeId(handle)), None)
    return node if node is not None else _sysfs_numa(bus)


def _nvml_slices(nvml: Any, handle: Any, parent: Device) -> list[Device]:
    slices = []
    for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        mig = _optional(nvml, partial(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, j), None)
        if mig is None:  # an index without a slice
            continue
        memory = nvml.nvmlDeviceGetMemoryInfo(mig)
        profile = _text(nvml.nvmlDeviceGetName(mig)).rpartition(" MIG ")[2]
        slices.append(_slice(parent, _text(nvml.nvmlDeviceGetUUID(mig)), profile, int(memory.total) >> 20,
                             int(memory.free) >> 20))
    return slices


def _nvml_peers(nvml: Any, handles: list[Any], buses: list[tuple[int, ...] | None]) -> dict[int, set[int]]:
    """GPUs joined by an active NVLink: directly (remote PCI address) or through NVSwitches."""
    by_bus = {bus: i for i, bus in enumerate(buses) if bus is not None}
    peers: dict[int, set[int]] = {}
    switched: set[int] = set()
    for i, handle in enumerate(handles):
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            remote = _optional(nvml, partial(_link_remote, nvml, handle, link), None)
            if remote == "switch":
                switched.add(i)
            elif remote in by_bus and by_bus[remote] != i:
                peers.setdefault(i, set()).add(by_bus[remote])
    for i in switched:
        peers.setdefault(i, set()).update(switched - {i})
    return peers


def _link_remote(nvml: Any, handle: Any, link: int) -> tuple[int, ...] | str | None:
    if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
        return None
    kind = _optional(nvml, lambda: nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link),
                     nvml.NVML_NVLINK_DEVICE_TYPE_GPU)
    if kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
        return "switch"
    return _bus(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)


def _pci_bus(nvml: Any, handle: Any) -> tuple[int, ...]:
    return _bus(nvml.nvmlDeviceGetPciInfo(handle).busId)


def _bus(bus_id: str | bytes) -> tuple[int, ...]:
    """``00000000:17:00.0`` and ``0000:17:00.0`` name the same PCI device."""
    domain, bus, rest = _text(bus_id).split(":")
    device, _, function = rest.partition(".")
    return int(domain, 16), int(bus, 16), int(device, 16), int(function or "0", 16)


def _sysfs_numa(bus: tuple[int, ...] | None) -> int:
    if bus is None:
        return -1
    try:
        node = Path(f"/sys/bus/pci/devices/{bus[0]:04x}:{bus[1]:02x}:{bus[2]:02x}.{bus[3]:x}/numa_node").read_text()
        return max(int(node), -1)
    except (OSError, ValueError):
        return -1


def _optional(nvml: Any, read: Callable[[], T], default: T) -> T:
    """A field NVML may not support on this GPU or driver."""
    try:
        return read()
    except nvml.NVMLError:
        return default


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode()


def _busy(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100


def sample_usage(devices: list[Device], nvml: Any = None) -> list[Device]:
    """``devices`` with their utilisation and free memory sampled again from NVML (for metrics and the console);
    unchanged without a driver, or for a device NVML no longer lists."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return devices
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return devices
    try:
        now = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            busy = _optional(nvml, partial(_busy, nvml, handle), 0.0)
            now[_text(nvml.nvmlDeviceGetUUID(handle))] = (busy, int(memory.free) >> 20)
    except nvml.NVMLError as exc:
        log.warning("NVML could not sample the GPUs' usage: %s", exc)
        return devices
    finally:
        nvml.nvmlShutdown()
    return [msgspec.structs.replace(d, utilization=now[d.uuid][0], memory_free_mb=now[d.uuid][1])
            if d.kind == "gpu" and not d.mig_profile and d.uuid in now else d for d in devices]
