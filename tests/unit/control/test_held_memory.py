"""What the plan's replicas hold, as placement counts it: each replica what it was bound with, not what the
current version of its service asks. Before, a replica of the version before (or the warm one) was counted at the
new version's size: a whole GPU read as 20 GB and another replica was placed on it; four 10 GB replicas read as
four times 40 GB and the new version was unschedulable on a GPU with room for it."""

from __future__ import annotations

import time

from ember._resources import GpuRequest
from ember.wire import Deployment, Device, FunctionSpec, Manifest, NodeInfo, ServiceSpec, SlotAssignment
from ember.wire.specs import Release, TrafficShare
from ember_platform.control.plan import cluster_snapshot, replica_request
from ember_platform.scheduler import Binding, place


def _service(gpu: GpuRequest) -> ServiceSpec:
    return ServiceSpec(name="m", kind="function", functions=[FunctionSpec(name="f", attr="f", input_mode="single")],
                       gpu=gpu, gpu_count=gpu.count)


def _rolling_out(before: GpuRequest, after: GpuRequest) -> tuple[Deployment, ServiceSpec]:
    """Version 2 (``after``) rolling out while version 1 (``before``) still takes every call."""
    v1, v2 = _service(before), _service(after)
    dep = Deployment(app="a", version=2, bundle_sha256="b2", created_at=0.0,
                     manifest=Manifest(app="a", module="main", services=[v2]),
                     releases=[Release(version=1, bundle_sha256="b1", created_at=0.0,
                                       manifest=Manifest(app="a", module="main", services=[v1]))],
                     traffic=[TrafficShare(version=1, percent=100)])
    return dep, v2


def _one_gpu_node() -> dict[str, NodeInfo]:
    gpu = Device(kind="gpu", index=0, name="NVIDIA H100 80GB HBM3", memory_total_mb=81920, uuid="GPU-n1-0")
    return {"n1": NodeInfo(node_id="n1", hostname="n1", updated_at=time.time(), cpu_cores=16, memory_mb=128000,
                           devices=[gpu])}


def _v1_slot(index: int, memory_mb: int) -> SlotAssignment:
    return SlotAssignment(replica_id=f"a-m-v1-{index}", app="a", service="m", version=1, index=index,
                          gpu_uuids=["GPU-n1-0"], gpu_indices=[0], memory_mb=memory_mb, bundle_sha256="b1")


def test_a_replica_holding_its_gpu_whole_is_not_shared_by_the_next_version() -> None:
    dep, v2 = _rolling_out(GpuRequest(count=1), GpuRequest(count=1, memory_mb=20_000))
    plan = {"n1": [_v1_slot(0, memory_mb=0)]}
    decision = place(cluster_snapshot(plan, _one_gpu_node(), {"a": dep}), [replica_request(dep, v2, "a-m-v2-0")])[0]
    assert not isinstance(decision, Binding), decision


def test_replicas_sharing_a_gpu_leave_the_next_version_the_rest() -> None:
    dep, v2 = _rolling_out(GpuRequest(count=1, memory_mb=10_000), GpuRequest(count=1, memory_mb=40_000))
    plan = {"n1": [_v1_slot(i, memory_mb=10_000) for i in range(4)]}
    decision = place(cluster_snapshot(plan, _one_gpu_node(), {"a": dep}), [replica_request(dep, v2, "a-m-v2-0")])[0]
    assert isinstance(decision, Binding) and decision.gpu_uuids == ("GPU-n1-0",), decision


def test_a_slot_written_without_its_memory_holds_what_its_own_version_asks() -> None:
    dep, v2 = _rolling_out(GpuRequest(count=1, memory_mb=10_000), GpuRequest(count=1, memory_mb=40_000))
    plan = {"n1": [_v1_slot(i, memory_mb=0) for i in range(4)]}  # as an older control plane wrote them
    decision = place(cluster_snapshot(plan, _one_gpu_node(), {"a": dep}), [replica_request(dep, v2, "a-m-v2-0")])[0]
    assert isinstance(decision, Binding), decision
