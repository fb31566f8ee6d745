"""The CPU as a device, for nodes without a GPU (GPUs come from ``inventory``: NVML or a declared file)."""

from __future__ import annotations

import os
import platform

from ember.wire import Device


def cpu_device() -> Device:
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    memory_mb = pages * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024) if pages > 0 else 0
    return Device(kind="cpu", index=0, name=_cpu_name(), memory_total_mb=memory_mb)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.machine() or 'cpu'} ({os.cpu_count()} cores)"
