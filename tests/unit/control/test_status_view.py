"""The status view from plain data: reservations per device, replicas per node, services against their bounds."""

from __future__ import annotations

import msgspec
from support.builders import deployment, service_spec, slot

from ember.cli.status import nodes_table, services_table, zygotes_table
from ember.wire import (
    Device,
    FunctionStats,
    Histogram,
    NodeInfo,
    ReplicaState,
    ReplicaStatus,
    ScaleBounds,
    ZygoteStatus,
)
from ember_platform.control.loop import ServiceState
from ember_platform.control.status import node_view, service_status
from ember_platform.scheduler import AutoscaleConfig, initial_state

GPU = service_spec("gpu", gpu_count=1, min_replicas=1, max_replicas=4)
CPU = service_spec("cpu")
SPECS = {("a", "gpu"): GPU, ("a", "cpu"): CPU}
NODE = NodeInfo(node_id="n", hostname="h", updated_at=1.0, devices=[
    Device(kind="gpu", index=0, name="A10G", memory_total_mb=24_000, uuid="GPU-0", memory_free_mb=20_000),
    Device(kind="gpu", index=1, name="A100", memory_total_mb=80_000, uuid="GPU-1", mig_enabled=True),
    Device(kind="gpu", index=1, name="A100 MIG 1g.10gb", memory_total_mb=10_000, uuid="MIG-1-0",
           mig_profile="1g.10gb", parent_uuid="GPU-1"),
    Device(kind="cpu", index=0, name="cpu", memory_total_mb=64_000),
])


def _replica(replica_id: str, service: str, state: ReplicaState, version: int = 2, queued: int = 0) -> ReplicaStatus:
    hist = Histogram(bounds=[1.0], counts=[0, 0], sum=0.0, count=0)
    stats = FunctionStats(function=service, calls=0, batches=0, expired=0, rejected=0, cancelled=0, failed=0,
                          queue_depth=queued, fill_ratio=0.0, batch_size=hist, queue_wait_s=hist, run_s=hist)
    return ReplicaStatus(replica_id=replica_id, node_id="n", app="a", service=service, version=version,
                         state=state, pid=1, started_at=0.0, updated_at=1.0, functions=[stats])


def test_devices_show_what_assigned_replicas_reserve() -> None:
    slots = [slot("g1", "GPU-0", service="gpu", version=2), slot("g2", "MIG-1-0", service="gpu", version=2),
             slot("c1", service="cpu", version=2)]
    replicas = [_replica("g1", "gpu", "ready"), _replica("c1", "cpu", "starting"),
                _replica("old", "gpu", "stopping", version=1)]
    view = node_view(NODE, slots, replicas, SPECS)
    a10g, a100, mig, cpu = view.devices
    assert (a10g.memory_reserved_mb, a10g.replicas) == (24_000, ["g1"])  # gpu=1 holds the GPU whole
    assert (mig.memory_reserved_mb, mig.replicas) == (10_000, ["g2"])
    assert (a100.memory_reserved_mb, a100.replicas) == (10_000, [])  # the sum of its slices
    assert (cpu.memory_reserved_mb, cpu.replicas) == (0, ["c1"])
    states = {r.replica_id: (r.state, r.gpu_uuids) for r in view.replicas}
    assert states == {"g1": ("ready", ["GPU-0"]), "g2": ("assigned", ["MIG-1-0"]), "c1": ("starting", []),
                      "old": ("stopping", [])}
    table = nodes_table([view])
    assert "3.9/23.4/23.4 GiB" in table and "g1 (ready)" in table and "old (stopping)" in table


def test_the_zygotes_table_names_the_gpus_each_holds() -> None:
    zygotes = [ZygoteStatus(app="a", service="gpu", version=2, state="ready", gpus=["GPU-0"]),
               ZygoteStatus(app="a", service="mig", version=2, state="building", gpus=["MIG-1-0", "GPU-gone"]),
               ZygoteStatus(app="a", service="cpu", version=2, state="ready")]
    view = node_view(msgspec.structs.replace(NODE, zygotes=zygotes), [], [], SPECS)
    header, _rule, *rows = zygotes_table([view]).splitlines()
    assert header.split()[:4] == ["NODE", "ZYGOTE", "STATE", "GPUS"]
    assert [row.split()[1:4] for row in rows] == [["a.gpu", "v2", "ready"], ["a.mig", "v2", "building"],
                                                  ["a.cpu", "v2", "ready"]]
    assert [row.split()[4] for row in rows] == ["gpu0", "gpu1,GPU-gone", "-"]  # by index; unknown: as reported


def test_service_status_uses_the_override_and_the_control_loops_state() -> None:
    dep = deployment(GPU, CPU, version=2, scale={"gpu": ScaleBounds(min_replicas=0, max_replicas=0)})
    state = ServiceState(autoscale=initial_state(AutoscaleConfig()), unschedulable="no GPU fits", desired=3)
    replicas = [_replica("r1", "gpu", "ready", queued=2), _replica("r2", "gpu", "starting"),
                _replica("r0", "gpu", "ready", version=1, queued=5), _replica("c", "cpu", "ready")]
    status = service_status(dep, GPU, replicas, state, {("a", "gpu"): 7, ("a", "cpu"): 100})
    assert (status.min_replicas, status.max_replicas, status.scaled) == (0, 1, True)  # max is at least 1
    assert (status.ready, status.starting, status.desired) == (1, 1, 3)
    assert (status.queue_depth, status.pending, status.unschedulable) == (7, 7, "no GPU fits")
    plain = service_status(dep, CPU, replicas, None, {})
    assert (plain.min_replicas, plain.max_replicas, plain.scaled, plain.desired) == (1, 1, False, 0)
    table = services_table([status, plain])
    assert "0..1 (scaled)" in table and "unschedulable: no GPU fits; 1 starting" in table
