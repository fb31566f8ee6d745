"""The GPU memory watch: what counts as a replica's usage, and when it is restarted for it.

The decision (``MemoryWatch``) is pure and tested on its own. Usage comes from NVML or from the
virtual driver of a declared inventory; without a GPU here, NVML is answered by a stand-in for the
hardware, and both sources must give the same sample for the same processes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.nvml import NVMLError

from ember_runtime.agent import gpu_usage
from ember_runtime.agent.gpu_usage import DeclaredUsage, NvmlUsage, process_trees
from ember_runtime.agent.memory_watch import Breach, MemoryWatch, Reservation, replica_usage

GB = 1024
HOG = Reservation(replica_id="a-hog-v1-0", pid=100, devices=("GPU-0",), memory_mb=8 * GB)


def over(mb: int, reservation: Reservation = HOG, device: str = "GPU-0") -> dict[str, dict[str, int]]:
    return {reservation.replica_id: {device: mb}}


# --- the decision --------------------------------------------------------------------------------


def test_two_samples_in_a_row_over_the_reservation_restart_the_replica() -> None:
    watch = MemoryWatch(strikes=2, tolerance_mb=512, tolerance_share=0.05)
    assert watch.observe([HOG], over(9318)) == []
    (breach,) = watch.observe([HOG], over(9318))
    assert breach == Breach(replica_id=HOG.replica_id, pid=100, device="GPU-0", used_mb=9318, reserved_mb=8192)
    assert breach.message() == "replica a-hog-v1-0 used 9.1 GB of GPU memory on GPU-0, reserved 8.0 GB: restarting"


def test_a_spike_that_does_not_last_is_forgiven() -> None:
    watch = MemoryWatch(strikes=2)
    assert watch.observe([HOG], over(9318)) == []
    assert watch.observe([HOG], over(4000)) == []  # back under: the count starts over
    assert watch.observe([HOG], over(9318)) == []
    assert watch.observe([HOG], {}) == []  # not sampled (restarting, say) counts as under
    assert watch.observe([HOG], over(9318)) == []
    assert len(watch.observe([HOG], over(9318))) == 1


def test_the_tolerance_covers_what_the_allocator_cap_does_not() -> None:
    watch = MemoryWatch(strikes=1, tolerance_mb=512, tolerance_share=0.05)
    assert watch.limit_mb(8 * GB) == 8 * GB + 512  # 5% of 8 GB is less than 512 MB
    assert watch.limit_mb(40 * GB) == 40 * GB + 2048  # 5% of 40 GB is more
    assert watch.observe([HOG], over(8 * GB + 512)) == []
    assert len(watch.observe([HOG], over(8 * GB + 513))) == 1


def test_a_restart_starts_the_count_over() -> None:
    watch = MemoryWatch(strikes=2)
    watch.observe([HOG], over(9318))
    assert len(watch.observe([HOG], over(9318))) == 1
    assert watch.observe([HOG], over(9318)) == []  # the kill takes a moment: not restarted twice at once


def test_a_new_process_of_the_same_replica_starts_clean() -> None:
    watch = MemoryWatch(strikes=2)
    watch.observe([HOG], over(9318))
    restarted = Reservation(replica_id=HOG.replica_id, pid=101, devices=HOG.devices, memory_mb=HOG.memory_mb)
    assert watch.observe([restarted], over(9318)) == []


def test_replicas_are_judged_apart_and_on_their_worst_gpu() -> None:
    watch = MemoryWatch(strikes=1)
    pair = Reservation(replica_id="a-pair-v1-0", pid=200, devices=("GPU-0", "GPU-1"), memory_mb=20 * GB)
    usage = {HOG.replica_id: {"GPU-0": 8 * GB}, pair.replica_id: {"GPU-0": 20 * GB, "GPU-1": 23 * GB}}
    (breach,) = watch.observe([HOG, pair], usage)
    assert (breach.replica_id, breach.device, breach.used_mb, breach.reserved_mb) == (
        "a-pair-v1-0", "GPU-1", 23 * GB, 20 * GB)


def test_a_replica_uses_what_its_process_tree_uses_on_its_own_devices() -> None:
    sample = {"GPU-0": {100: 5000, 150: 4318, 999: 70_000}, "GPU-1": {100: 3000}}
    usage = replica_usage([HOG], sample, {100: {100, 150}})
    assert usage == {HOG.replica_id: {"GPU-0": 9318}}  # 999 is someone else; GPU-1 is not HOG's


# --- which processes are the replica's -----------------------------------------------------------

_TREE = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
print(child.pid, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def replica_like() -> Iterator[tuple[int, int]]:
    """A session leader with a worker, as the agent starts replicas; both end when stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None and proc.stdin is not None
    worker = int(proc.stdout.readline())
    yield proc.pid, worker
    proc.stdin.close()
    proc.wait(30)
    proc.stdout.close()


def test_a_process_tree_holds_its_workers_and_nothing_else(replica_like: tuple[int, int]) -> None:
    leader, worker = replica_like
    trees = process_trees([leader, os.getpid()])
    assert trees[leader] == {leader, worker}
    assert leader in trees[os.getpid()]  # started by this process, though in its own session


def test_a_gone_process_is_a_tree_of_itself() -> None:
    assert process_trees([2**22 + 1]) == {2**22 + 1: {2**22 + 1}}


# --- the virtual driver of a declared inventory --------------------------------------------------


def declare(table: Path, pid: int, usage: dict[str, int]) -> None:
    (table / str(pid)).write_text(json.dumps(usage))


def test_the_virtual_driver_reports_what_live_processes_declared(tmp_path: Path,
                                                                 replica_like: tuple[int, int]) -> None:
    leader, worker = replica_like
    table = tmp_path / "gpu-processes"
    source = DeclaredUsage(table, ["GPU-0", "GPU-1"])
    declare(table, leader, {"GPU-0": 5000})
    declare(table, worker, {"GPU-0": 4318, "GPU-9": 1})  # GPU-9 is not this node's
    assert source.sample(["GPU-0", "GPU-1", "GPU-7"]) == {"GPU-0": {leader: 5000, worker: 4318}, "GPU-1": {}}


_HOLDER = """
import json, os, sys
fds = []  # each entry held open while this process lives, as a driver's context
for arg in sys.argv[1:]:  # ENTRY=MB
    entry, mb = arg.rsplit("=", 1)
    fds.append(os.open(entry + ".tmp", os.O_CREAT | os.O_WRONLY))
    os.write(fds[-1], json.dumps({"GPU-0": int(mb)}).encode())
    os.rename(entry + ".tmp", entry)
print("held", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def _holding(*entries: str) -> Iterator[int]:
    """A process that declares and holds open each ``ENTRY=MB`` until the block ends; its pid."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, *entries], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield holder.pid
    finally:
        holder.communicate("")


def test_an_entry_belongs_to_the_processes_holding_it_open_whatever_its_name(tmp_path: Path) -> None:
    """A sandboxed replica knows only its namespace's pid (2, say): the driver finds the holder's pid here."""
    table = tmp_path / "gpu-processes"
    source = DeclaredUsage(table, ["GPU-0"])
    with _holding(f"{table / '2'}=700") as pid:
        assert source.sample(["GPU-0"], [pid]) == {"GPU-0": {pid: 700}}
    freed = source.sample(["GPU-0"], [pid])
    assert freed in ({"GPU-0": {}}, {"GPU-0": {2: 700}})  # freed (unless a pid 2 lives here)


def test_a_process_holding_two_entries_uses_their_sum(tmp_path: Path) -> None:
    """Two contexts of one process on a GPU (two entries it holds open): NVML reports the process's total."""
    table = tmp_path / "gpu-processes"
    source = DeclaredUsage(table, ["GPU-0"])
    with _holding(f"{table / 'a'}=700", f"{table / 'b'}=300") as pid:
        assert source.sample(["GPU-0"], [pid]) == {"GPU-0": {pid: 1000}}


def test_the_virtual_driver_frees_the_memory_of_exited_processes(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    table = tmp_path / "gpu-processes"
    source = DeclaredUsage(table, ["GPU-0"])
    declare(table, int(done.stdout), {"GPU-0": 5000})
    assert source.sample(["GPU-0"]) == {"GPU-0": {}}
    assert not (table / done.stdout.strip()).exists()


def test_a_half_written_declaration_is_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    table = tmp_path / "gpu-processes"
    source = DeclaredUsage(table, ["GPU-0"])
    (table / str(os.getpid())).write_text('{"GPU-0": 50')
    with caplog.at_level(logging.WARNING, logger="ember.agent"):
        assert source.sample(["GPU-0"]) == {"GPU-0": {}}
    assert "virtual GPU process table" in caplog.text


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "huge"])
def test_an_entry_that_is_no_plain_small_file_is_skipped(tmp_path: Path, kind: str) -> None:
    """The table is a folder replicas write: a FIFO nobody writes held the agent's watch for good, a link to
    ``/dev/zero`` read until the agent ran out of memory."""
    table = tmp_path / "gpu-processes"
    source = DeclaredUsage(table, ["GPU-0"])
    entry = table / str(os.getpid())
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "huge":
        entry.write_text('{"GPU-0": 50}' + " " * (1 << 20))
    else:
        entry.symlink_to("/dev/zero")
    assert source.sample(["GPU-0"]) == {"GPU-0": {}}


# --- NVML ----------------------------------------------------------------------------------------


class ProcessNvml:
    """The nvidia-ml-py calls ``NvmlUsage`` makes, answering for GPUs (and MIG slices) given as plain data:
    ``{"uuid", "procs": {pid: MB or None}, "mig": [{"uuid", "procs"}], "mps": {pid: MB}}``."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[dict[str, Any]], *, v3: bool = True) -> None:
        self.gpus = gpus
        self.calls: list[str] = []
        if v3:
            self.nvmlDeviceGetComputeRunningProcesses_v3 = self._compute
        else:
            self.nvmlDeviceGetComputeRunningProcesses = self._compute

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, handle: dict[str, Any]) -> bytes:
        return handle["uuid"].encode()

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: dict[str, Any]) -> int:
        if "mig" not in handle:
            raise NVMLError("Not Supported")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: dict[str, Any], j: int) -> dict[str, Any]:
        if j >= len(handle["mig"]):
            raise NVMLError("Not Found")
        return handle["mig"][j]

    def _compute(self, handle: dict[str, Any]) -> list[SimpleNamespace]:
        self.calls.append(f"compute {handle['uuid']}")
        return [SimpleNamespace(pid=pid, usedGpuMemory=None if mb is None else mb << 20, gpuInstanceId=0,
                                computeInstanceId=0) for pid, mb in handle.get("procs", {}).items()]

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: dict[str, Any]) -> list[SimpleNamespace]:
        if "mps" not in handle:
            raise NVMLError("Not Supported")
        return [SimpleNamespace(pid=pid, usedGpuMemory=mb << 20) for pid, mb in handle["mps"].items()]


def test_nvml_and_the_virtual_driver_give_the_same_sample(tmp_path: Path) -> None:
    nvml = ProcessNvml([{"uuid": "GPU-0", "procs": {100: 5000, 150: 4318}}, {"uuid": "GPU-1"}])
    table = tmp_path / "gpu-processes"
    declared = DeclaredUsage(table, ["GPU-0", "GPU-1"])
    # The virtual driver only keeps live processes: declare for real pids standing in for 100 and 150.
    me, parent = os.getpid(), os.getppid()
    declare(table, me, {"GPU-0": 5000})
    declare(table, parent, {"GPU-0": 4318})
    renamed = {me: 100, parent: 150}
    virtual = {uuid: {renamed[pid]: mb for pid, mb in procs.items()} for uuid, procs in declared.sample(
        ["GPU-0", "GPU-1", "GPU-7"]).items()}
    assert NvmlUsage(nvml).sample(["GPU-0", "GPU-1", "GPU-7"]) == virtual == {"GPU-0": {100: 5000, 150: 4318},
                                                                           "GPU-1": {}}


def test_nvml_reads_mig_slices_by_uuid_and_skips_unknown_amounts() -> None:
    nvml = ProcessNvml([{"uuid": "GPU-0", "mig": [{"uuid": "MIG-0-0", "procs": {100: 9000, 101: None}},
                                                  {"uuid": "MIG-0-1", "procs": {200: 1}}]}], v3=False)
    usage = NvmlUsage(nvml)
    assert usage.sample(["MIG-0-0"]) == {"MIG-0-0": {100: 9000}}
    usage.close()
    assert nvml.calls == ["init", "compute MIG-0-0", "shutdown"]


def test_nvml_counts_mps_clients_once() -> None:
    nvml = ProcessNvml([{"uuid": "GPU-0", "procs": {100: 900}, "mps": {100: 900, 300: 2000}}])
    assert NvmlUsage(nvml).sample(["GPU-0"]) == {"GPU-0": {100: 900, 300: 2000}}


def test_an_nvml_failure_reaches_the_watch() -> None:
    nvml = ProcessNvml([{"uuid": "GPU-0"}])

    def lost(handle: dict[str, Any]) -> list[SimpleNamespace]:
        raise NVMLError("GPU is lost")

    nvml.nvmlDeviceGetComputeRunningProcesses_v3 = lost
    with pytest.raises(NVMLError, match="GPU is lost"):
        NvmlUsage(nvml).sample(["GPU-0"])


def test_an_entry_renamed_into_place_while_the_driver_samples_is_kept(tmp_path: Path, monkeypatch) -> None:
    """A process writes its entry under a dot name, then renames it into place, holding it open. Before, the
    driver scanned /proc for holders first and listed the table after: an entry renamed in between (a slow scan,
    on a loaded node) was listed with no holder found and deleted as a dead process's, so the memory it declared
    was never counted (the enforcement test's missing restart)."""
    table = tmp_path / "table"
    usage = DeclaredUsage(table, ["GPU-0"])
    (table / "other").write_text(json.dumps({"GPU-1": 5}))  # an entry listed, so that the driver scans
    fd = os.open(table / ".entry", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, json.dumps({"GPU-0": 100}).encode())
    scan = gpu_usage._holders

    def renamed_during_the_scan(where: Path, *args: Any) -> dict[str, set[int]]:
        held = scan(where, *args)
        os.rename(table / ".entry", table / "entry")  # the writer, while the driver reads /proc
        return held

    try:
        monkeypatch.setattr(gpu_usage, "_holders", renamed_during_the_scan)
        usage.sample(["GPU-0"], [os.getpid()])
        monkeypatch.setattr(gpu_usage, "_holders", scan)
        assert usage.sample(["GPU-0"], [os.getpid()]) == {"GPU-0": {os.getpid(): 100}}
    finally:
        os.close(fd)


def test_an_empty_table_is_read_without_scanning_every_process(tmp_path: Path, monkeypatch) -> None:
    """Reading every process's open files costs seconds on a node of a few hundred sandboxes (pasta holds ~430
    each); with nothing declared there is nothing to find."""
    def no_scan(*args: Any) -> dict[str, set[int]]:
        raise AssertionError("scanned /proc for an empty table")

    monkeypatch.setattr(gpu_usage, "_holders", no_scan)
    assert DeclaredUsage(tmp_path / "table", ["GPU-0"]).sample(["GPU-0"]) == {"GPU-0": {}}

