"""GPU faults: which Xid errors put a GPU out of service, and the two sources that report them.

The decision (``GpuFaults``) is pure. The errors come from NVML's events or from the virtual driver of a declared
inventory (a file); without a GPU here, NVML is answered by a stand-in for the driver that hands out device
handles as ctypes pointers, new objects each time, as the real one does.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.nvml import NVMLError

from ember.wire import Device
from ember_runtime.agent import gpu_faults
from ember_runtime.agent.gpu_faults import DeclaredXids, GpuFaults, NvmlXids, Xid

GPU0 = Device(kind="gpu", index=0, name="H100", uuid="GPU-0", memory_total_mb=81_920, mig_enabled=True)
SLICE = Device(kind="gpu", index=0, name="H100 MIG 1g.10gb", uuid="MIG-0-0", parent_uuid="GPU-0",
               mig_profile="1g.10gb", memory_total_mb=9_856)
GPU1 = Device(kind="gpu", index=1, name="H100", uuid="GPU-1", memory_total_mb=81_920)
CPU = Device(kind="cpu", index=0, name="virtual CPU")


# --- the decision --------------------------------------------------------------------------------


def test_a_critical_xid_puts_the_gpu_and_its_slices_out_of_service() -> None:
    faults = GpuFaults()
    assert faults.record(Xid("GPU-0", 79), now=0) == "Xid 79 at 00:00:00 UTC"
    devices = faults.apply([CPU, GPU0, SLICE, GPU1])
    assert devices[0] == CPU and devices[3] == GPU1  # untouched
    assert (devices[1].fault, devices[1].xid) == ("Xid 79 at 00:00:00 UTC", 79)
    assert (devices[2].fault, devices[2].xid) == ("Xid 79 at 00:00:00 UTC", 79)  # the slice: its GPU's


def test_an_applications_own_xid_is_reported_and_leaves_the_gpu_in_service() -> None:
    faults = GpuFaults()
    for xid in (13, 31, 43, 45, 68, 109):
        assert faults.record(Xid("GPU-1", xid)) == ""
    (gpu,) = faults.apply([GPU1])
    assert (gpu.xid, gpu.fault) == (109, "")


def test_the_first_fault_stays_the_reason_and_the_last_xid_is_shown() -> None:
    faults = GpuFaults()
    faults.record(Xid("GPU-1", 48), now=3600)
    assert faults.record(Xid("GPU-1", 79), now=7200) == ""  # out of service already
    assert faults.record(Xid("GPU-1", 13)) == ""
    (gpu,) = faults.apply([GPU1])
    assert (gpu.xid, gpu.fault) == (13, "Xid 48 at 01:00:00 UTC")


def test_the_ignored_xids_can_be_chosen() -> None:
    faults = GpuFaults(ignored={79})
    assert faults.record(Xid("GPU-1", 79)) == ""
    assert faults.record(Xid("GPU-1", 13)) != ""


# --- the virtual driver's file -------------------------------------------------------------------


def test_the_declared_file_is_read_line_by_line_once(tmp_path: Path) -> None:
    path = tmp_path / "gpu-xids"
    source = DeclaredXids(path, ["GPU-0", "GPU-1"])
    assert source.wait(0.05) == []  # no file yet
    path.write_bytes(b"GPU-0 79\nGPU-1 1")  # the second line is still being written
    assert source.wait(0.05) == [Xid("GPU-0", 79)]
    assert source.wait(0.05) == []
    with path.open("ab") as file:
        file.write(b"3\n")
    assert source.wait(0.05) == [Xid("GPU-1", 13)]


def test_lines_that_are_not_events_of_its_gpus_are_skipped_and_said(tmp_path: Path, caplog) -> None:
    path = tmp_path / "gpu-xids"
    hostile = [b"GPU-9 79", b"GPU-0", b"GPU-0 79 extra", b"GPU-0 -1", b"GPU-0 99999999999", b"GPU-0 \xff\xfe",
               "GPU-0 \u0663".encode(), b"GPU-0 " + b"1" * 300, b"", b"GPU-1 48"]
    path.write_bytes(b"\n".join(hostile) + b"\n")
    with caplog.at_level(logging.WARNING, logger="ember.agent"):
        assert DeclaredXids(path, ["GPU-0", "GPU-1"]).wait(0.05) == [Xid("GPU-1", 48)]
    assert sum("skipped a line" in r.getMessage() for r in caplog.records) == 8  # the empty line is not one


def test_the_watch_records_what_comes_and_has_the_node_report_at_once(tmp_path: Path) -> None:
    path = tmp_path / "gpu-xids"
    source = DeclaredXids(path, ["GPU-0", "GPU-1"])
    faults = GpuFaults()
    changes: list[int] = []

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(gpu_faults.watch(source, faults, stop, lambda: changes.append(1)))
        await asyncio.sleep(0.2)
        assert changes == []
        path.write_text("GPU-1 13\nGPU-0 95\n")
        for _ in range(50):
            if changes:
                break
            await asyncio.sleep(0.1)
        stop.set()
        source.close()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    assert changes == [1]
    assert faults.faults.keys() == {"GPU-0"} and faults.last_xid == {"GPU-0": 95, "GPU-1": 13}


def test_the_source_of_a_node_without_gpus_is_none(tmp_path: Path) -> None:
    assert gpu_faults.source_for([CPU], tmp_path / "gpu-xids") is None
    declared = gpu_faults.source_for([CPU, GPU0, SLICE, GPU1], tmp_path / "gpu-xids")
    assert isinstance(declared, DeclaredXids)
    (tmp_path / "gpu-xids").write_text("MIG-0-0 79\nGPU-0 79\n")  # an Xid is a whole GPU's
    assert declared.wait(0.05) == [Xid("GPU-0", 79)]


# --- NVML's events -------------------------------------------------------------------------------

TIMEOUT, NOT_SUPPORTED, UNKNOWN = 10, 3, 999
XID_CRITICAL = 0x8


class FakeDriver(SimpleNamespace):
    """What ``NvmlXids`` asks of pynvml, for three GPUs, of which GPU 2 cannot report events."""

    NVMLError = NVMLError
    NVML_ERROR_TIMEOUT = TIMEOUT
    nvmlEventTypeXidCriticalError = XID_CRITICAL

    def __init__(self) -> None:
        super().__init__(events=[], registered=[], freed=False, shut=False)

    @staticmethod
    def _error(value: int) -> NVMLError:
        exc = NVMLError(f"NVML error {value}")
        exc.value = value  # type: ignore[attr-defined]
        return exc

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlEventSetCreate(self) -> str:
        return "the-set"

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed = event_set == "the-set"

    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return ctypes.c_void_p(0x1000 + index)  # a new object each time, for the same device

    def nvmlDeviceGetUUID(self, handle: Any) -> bytes:
        return f"GPU-{handle.value - 0x1000}".encode()

    def nvmlDeviceRegisterEvents(self, handle: Any, kinds: int, event_set: str) -> None:
        if handle.value == 0x1002:
            raise self._error(NOT_SUPPORTED)
        self.registered.append((handle.value, kinds, event_set))

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        if not self.events:
            raise self._error(TIMEOUT)
        event = self.events.pop(0)
        if isinstance(event, int):
            raise self._error(event)
        return event

    def event(self, device: int | None, xid: int, kind: int = XID_CRITICAL) -> SimpleNamespace:
        handle = ctypes.c_void_p(0x1000 + device) if device is not None else ctypes.c_void_p(0x9999)
        return SimpleNamespace(device=handle, eventType=kind, eventData=xid, gpuInstanceId=0, computeInstanceId=0)


def test_nvml_events_name_their_gpu_by_its_handle(caplog) -> None:
    driver = FakeDriver()
    with caplog.at_level(logging.WARNING, logger="ember.agent"):
        source = NvmlXids(driver)
    assert [r[0] for r in driver.registered] == [0x1000, 0x1001]
    assert all(kinds == XID_CRITICAL for _, kinds, _ in driver.registered)
    assert any("GPU-2 cannot report Xid errors" in r.getMessage() for r in caplog.records)
    assert source.wait(0.01) == []  # the driver's timeout
    driver.events = [driver.event(1, 79), driver.event(0, 13), driver.event(0, 48, kind=0x1)]
    assert source.wait(1) == [Xid("GPU-1", 79)]
    assert source.wait(1) == [Xid("GPU-0", 13)]
    assert source.wait(1) == []  # not an Xid event
    source.close()
    assert driver.freed and driver.shut


def test_an_nvml_event_of_an_unknown_handle_makes_every_watched_gpu_suspect() -> None:
    driver = FakeDriver()
    source = NvmlXids(driver)
    driver.events = [driver.event(None, 79)]
    assert source.wait(1) == [Xid("GPU-0", 79), Xid("GPU-1", 79)]


def test_a_failing_nvml_wait_is_an_error_not_a_fault() -> None:
    driver = FakeDriver()
    source = NvmlXids(driver)
    driver.events = [UNKNOWN]
    with pytest.raises(NVMLError):
        source.wait(1)


# --- the agent's --ignore-xids ---------------------------------------------------------------------


def test_ignore_xids_adds_to_an_applications_own_or_ignores_all() -> None:
    assert gpu_faults.ignored_xids("") == gpu_faults.APPLICATION_XIDS
    assert gpu_faults.ignored_xids(" 94, 79 ,") == gpu_faults.APPLICATION_XIDS | {79, 94}
    assert gpu_faults.ignored_xids("ALL") is gpu_faults.ALL
    for bad, named in (("79,x", "'x'"), ("-1", "'-1'"), ("1e3", "'1e3'"), ("79;94", "'79;94'")):
        with pytest.raises(ValueError, match=named):
            gpu_faults.ignored_xids(bad)
    faults = GpuFaults(gpu_faults.ignored_xids("79") or ())
    assert faults.record(Xid("GPU-0", 79)) == "" and faults.record(Xid("GPU-0", 48)) != ""


def test_the_agent_refuses_an_ignore_xids_that_is_not_a_list_of_xids() -> None:
    refused = subprocess.run([sys.executable, "-m", "ember_runtime", "--ignore-xids", "79,x"], capture_output=True,
                             text=True, timeout=60, check=False)
    assert refused.returncode == 2 and "--ignore-xids" in refused.stderr and "'x' is not an Xid" in refused.stderr
