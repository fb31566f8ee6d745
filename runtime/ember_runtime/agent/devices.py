"""The CPU as a device, for nodes without a GPU (GPUs come from ``inventory``: NVML or a declared file), and the
device nodes a replica's sandbox binds for its GPUs: the real ones, or a declared inventory's stand-ins."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from pathlib import Path

from ember.wire import Device

REAL = Path("/dev")  # where a node with real GPUs has their device nodes
# The device nodes every CUDA process needs besides its GPUs' own (``/dev/nvidiaN``).
NVIDIA_SHARED = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
                 "/dev/nvidia-caps")


def cpu_device() -> Device:
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    memory_mb = pages * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024) if pages > 0 else 0
    return Device(kind="cpu", index=0, name=_cpu_name(), memory_total_mb=memory_mb)


def stand_ins(folder: Path, devices: Iterable[Device]) -> Path:
    """Stand-ins for the device nodes of a declared inventory's GPUs, made in ``folder`` (returned): a link to
    ``/dev/null`` for each GPU's ``nvidiaN`` and for the nodes every CUDA process opens, so that what a sandbox
    binds is a character device that holds nothing (no replica can leave data there for another on the same GPU).
    A sandboxed replica on a virtual GPU is then given its GPUs' nodes as one on a real GPU is given theirs
    (``gpu_devices``, bound at ``/dev/<name>``): its own GPUs' and no other's, with what follows from holding them
    (it forks only from a zygote whose sandbox holds the same, see ``slots.unforkable``). MIG's ``nvidia-caps`` has
    no stand-in."""
    folder.mkdir(parents=True, exist_ok=True)
    shared = [Path(path).name for path in NVIDIA_SHARED if not path.endswith("-caps")]
    for name in {f"nvidia{d.index}" for d in devices if d.kind == "gpu"}.union(shared):
        link = folder / name
        if not (link.is_symlink() and os.readlink(link) == os.devnull):
            link.unlink(missing_ok=True)
            link.symlink_to(os.devnull)
    return folder


def gpu_devices(indices: Iterable[int], dev: Path = REAL) -> tuple[str, ...]:
    """The device nodes of these GPUs (``nvidiaN`` in ``dev``: ``/dev``, or a declared inventory's stand-ins) and
    those every CUDA process needs, where they exist; none on a CPU node."""
    wanted = [str(dev / f"nvidia{i}") for i in sorted(set(indices))]
    shared = [str(dev / Path(p).name) for p in NVIDIA_SHARED]
    return tuple(p for p in (*wanted, *shared) if os.path.exists(p)) if wanted else ()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.machine() or 'cpu'} ({os.cpu_count()} cores)"
