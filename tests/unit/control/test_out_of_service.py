"""What the control loop does with a GPU its node put out of service: no slot for placement, the replicas on it to
replace (beside those that gave way on their own), and their host memory still counted on their node meanwhile."""

from __future__ import annotations

import time

import msgspec

from ember.wire import Device, NodeInfo, ReplicaStatus, SlotAssignment
from ember_platform.control.plan import on_faulty_gpus, to_replace
from ember_platform.scheduler import Cluster, PlacementRequest, Reservation, build_snapshot, parse_gpu
from ember_platform.scheduler.decision import Binding, Unschedulable
from ember_platform.scheduler.placement import place

FAULT = "Xid 79 at 12:00:00 UTC"


def gpu(index: int, fault: str = "", **kwargs: object) -> Device:
    fields: dict[str, object] = {"uuid": f"GPU-{index}", "memory_total_mb": 24_576, **kwargs}
    return Device(kind="gpu", index=index, name="A10G", fault=fault, **fields)  # type: ignore[arg-type]


def node(*devices: Device, node_id: str = "n1") -> NodeInfo:
    return NodeInfo(node_id=node_id, hostname=node_id, devices=list(devices), updated_at=time.time())


def slot(replica_id: str, *uuids: str) -> SlotAssignment:
    return SlotAssignment(replica_id=replica_id, app="a", service="s", version=1, index=0, gpu_uuids=list(uuids))


def status(replica_id: str, state: str, gave_way: str = "", message: str = "") -> ReplicaStatus:
    return ReplicaStatus(replica_id=replica_id, node_id="n1", app="a", service="s", version=1, state=state,  # type: ignore[arg-type]
                         pid=1, started_at=0, updated_at=0, gave_way=gave_way, message=message)


def test_a_gpu_out_of_service_has_no_slot() -> None:
    cluster = Cluster.from_nodes([node(gpu(0, FAULT), gpu(1))])
    assert [s.uuid for s in cluster.slots] == ["GPU-1"]
    sliced = Cluster.from_nodes([node(gpu(0, mig_enabled=True),
                                      gpu(0, FAULT, uuid="MIG-0-0", parent_uuid="GPU-0", mig_profile="1g.6gb"),
                                      gpu(0, uuid="MIG-0-1", parent_uuid="GPU-0", mig_profile="1g.6gb"))])
    assert [s.uuid for s in sliced.slots] == ["MIG-0-1"]


def test_the_replicas_on_a_faulty_gpu_are_found_on_their_own_node() -> None:
    plan = {"n1": [slot("r1", "GPU-0"), slot("r2", "GPU-1"), slot("r3")], "n2": [slot("r4", "GPU-0")]}
    nodes = {"n1": node(gpu(0, FAULT), gpu(1)), "n2": node(gpu(0), node_id="n2")}  # n2's GPU-0 is another GPU
    assert on_faulty_gpus(plan, nodes) == {"r1": f"GPU 0 (GPU-0) of node n1 reported {FAULT}"}
    assert on_faulty_gpus(plan, {"n2": nodes["n2"]}) == {}  # a node that does not report: nothing known


def test_to_replace_takes_the_faulty_and_those_that_gave_way() -> None:
    slots = [slot("r1", "GPU-0"), slot("r2", "GPU-1"), slot("r3", "GPU-1"), slot("r4", "GPU-1")]
    replicas = {"r1": status("r1", "ready"), "r2": status("r2", "stopping", "health", "its check failed"),
                "r3": status("r3", "ready"), "r4": status("r4", "stopping")}
    assert to_replace(slots, replicas, {"r1": "GPU 0 reported it"}) == {
        "r1": ("gpu", "GPU 0 reported it"), "r2": ("health", "its check failed"), "r4": ("other", "")}


def test_a_replica_on_a_faulty_gpu_still_holds_its_nodes_memory_until_it_is_replaced() -> None:
    # n1: 16 GB of host memory, two GPUs; r1 on GPU-0, which failed, reserved 12 GB of it and runs until replaced.
    n1 = msgspec.structs.replace(node(gpu(0, FAULT), gpu(1)), memory_mb=16_384, cpu_cores=8)
    held = Reservation(replica_id="r1", function="a.s", node_id="n1", gpu_uuids=("GPU-0",), host_memory_mb=12_288,
                       cpu_millis=1000)
    snapshot = build_snapshot(Cluster.from_nodes([n1]), [held])
    assert snapshot.orphans == (held,)  # no GPU slot: nothing is placed on GPU-0
    ask = PlacementRequest(replica_id="r1-next", function="a.s", gpu=parse_gpu(1), host_memory_mb=8192)
    (decision,) = place(snapshot, [ask])
    assert isinstance(decision, Unschedulable), decision  # 12 + 8 GB would be past the node's 16
    (fits,) = place(snapshot, [msgspec.structs.replace(ask, host_memory_mb=4096)])
    assert isinstance(fits, Binding) and fits.gpu_uuids == ("GPU-1",), fits
