"""Device discovery: GPUs through NVML where a driver exists, otherwise the CPU as one device."""

from __future__ import annotations

import logging
import os
import platform

from ember._wire import Device

log = logging.getLogger("ember.devices")


def discover() -> list[Device]:
    """The node's devices; never noisy on a machine without a GPU or without nvidia-ml-py."""
    gpus = _nvml_gpus()
    return gpus if gpus else [cpu_device()]


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


def _nvml_gpus() -> list[Device]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append(Device(kind="gpu", index=i, name=name if isinstance(name, str) else name.decode(),
                                  memory_total_mb=int(memory.total) // (1024 * 1024),
                                  uuid=_text(pynvml.nvmlDeviceGetUUID(handle))))
        return devices
    except pynvml.NVMLError as exc:
        log.warning("NVML found a driver but failed to list GPUs: %s", exc)
        return []
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode()
