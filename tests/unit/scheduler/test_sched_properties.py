"""Properties of placement on generated clusters: nothing is ever over-committed, whatever is asked."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.wire import Device, NodeInfo
from ember_platform.scheduler import (
    Binding,
    Cluster,
    GpuRequest,
    PlacementRequest,
    Priority,
    Snapshot,
    apply_decisions,
    build_snapshot,
    place,
    place_and_apply,
)

MODELS = [("H100", 81920), ("A10G", 24576), ("L4", 23034)]
PROFILES = {"1g.10gb": 10240, "2g.20gb": 20480, "3g.40gb": 40960}


_MODEL = st.sampled_from(MODELS)
_PROFILE = st.sampled_from(sorted(PROFILES))
_BIT = st.booleans()
_PEERS = st.lists(st.integers(0, 3), max_size=3)
_NUMA = st.integers(0, 1)
_PROFILES = st.lists(_PROFILE, min_size=1, max_size=4)
_GPU_COUNT = st.integers(0, 4)
_CORES = st.integers(1, 8)
_GB = st.integers(1, 64)
_GPU_REQUEST = st.one_of(
    st.just(GpuRequest()),
    st.builds(lambda gb: GpuRequest(count=1, memory_mb=gb * 1024), st.integers(1, 40)),
    st.builds(lambda t: GpuRequest(count=1, types=t), st.sampled_from([(), ("H100",), ("L4", "A10G")])),
    st.builds(lambda n, mb, topo: GpuRequest(count=n, memory_mb=mb, topology=topo),
              st.integers(2, 3), st.sampled_from([0, 8192]), st.sampled_from([None, "nvlink"])),
    st.builds(lambda p: GpuRequest(count=1, mig_profile=p), _PROFILE),
)
_FUNCTION = st.sampled_from(["f0", "f1", "f2", "f3"])
_HALF_CORES = st.integers(0, 4)
_HOST_GB = st.integers(0, 8)
_PRIORITY: st.SearchStrategy[Priority] = st.sampled_from(["interactive", "batch"])
_BUNDLE = st.sampled_from(["", "b1"])


@st.composite
def gpus(draw: st.DrawFn, node: int, index: int) -> list[Device]:
    name, memory = draw(_MODEL)
    uuid = f"GPU-{node}-{index}"
    base = Device(kind="gpu", index=index, name=name, memory_total_mb=memory, uuid=uuid,
                  nvlink_peers=sorted(set(draw(_PEERS)) - {index}), numa_node=draw(_NUMA))
    if name != "H100" or not draw(_BIT):
        return [base]
    slices = [Device(kind="gpu", index=index, name=f"{name} MIG {p}", memory_total_mb=PROFILES[p],
                     uuid=f"MIG-{uuid}-{j}", mig_profile=p, parent_uuid=uuid) for j, p in enumerate(draw(_PROFILES))]
    return [Device(kind="gpu", index=index, name=name, memory_total_mb=memory, uuid=uuid, mig_enabled=True), *slices]


@st.composite
def nodes(draw: st.DrawFn, nid: int) -> NodeInfo:
    devices = [d for i in range(draw(_GPU_COUNT)) for d in draw(gpus(nid, i))]
    return NodeInfo(node_id=f"n{nid}", hostname="h", devices=devices or [Device(kind="cpu", index=0, name="cpu")],
                    updated_at=0.0, cpu_cores=draw(_CORES), memory_mb=draw(_GB) * 1024)


@st.composite
def requests(draw: st.DrawFn, i: int) -> PlacementRequest:
    return PlacementRequest(replica_id=f"r{i}", function=draw(_FUNCTION), gpu=draw(_GPU_REQUEST),
                            cpu_millis=draw(_HALF_CORES) * 500, host_memory_mb=draw(_HOST_GB) * 1024,
                            priority=draw(_PRIORITY), bundle=draw(_BUNDLE))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Cluster, list[PlacementRequest], list[PlacementRequest]]:
    cluster = Cluster.from_nodes([draw(nodes(i)) for i in range(draw(st.integers(1, 4)))])
    first = [draw(requests(i)) for i in range(draw(st.integers(0, 12)))]
    second = [draw(requests(100 + i)) for i in range(draw(st.integers(1, 12)))]
    return cluster, first, second


def assert_not_overcommitted(s: Snapshot) -> None:
    """Recomputed from the reservations alone, not from the snapshot's own counters."""
    cluster = s.cluster
    by_uuid = {(cluster.nodes[slot.nid].node_id, slot.uuid): slot for slot in cluster.slots}
    used: dict[tuple[str, str], int] = defaultdict(int)
    holders: dict[tuple[str, str], list[int]] = defaultdict(list)
    cpu: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    for r in s.reservations.values():
        cpu[r.node_id] += r.cpu_millis
        memory[r.node_id] += r.host_memory_mb
        assert len(set(r.gpu_uuids)) == len(r.gpu_uuids)
        for uuid in r.gpu_uuids:
            slot = by_uuid[r.node_id, uuid]
            used[r.node_id, uuid] += r.memory_mb or slot.total_mb
            holders[r.node_id, uuid].append(r.memory_mb)
    for key, mb in used.items():
        assert mb <= by_uuid[key].total_mb, (key, mb)
        assert 0 not in holders[key] or len(holders[key]) == 1, "a whole GPU or MIG slice is shared"
        assert not by_uuid[key].mig_profile or holders[key] == [0], "a MIG slice is shared by memory"
    for n in cluster.nodes:
        assert cpu[n.node_id] <= n.cpu_millis and memory[n.node_id] <= n.memory_mb


def assert_binding_matches(cluster: Cluster, item: PlacementRequest, b: Binding, batch: set[str]) -> None:
    slots = [cluster.slots[cluster.slot_index[b.node_id, u]] for u in b.gpu_uuids]
    assert len(slots) == item.gpu.count
    assert all(s.mig_profile == item.gpu.mig_profile for s in slots)
    assert not item.gpu.types or all(any(t in s.name for t in item.gpu.types) for s in slots)
    if item.gpu.topology == "nvlink":
        assert all(b2.gpu_index in a.nvlink for a in slots for b2 in slots if a is not b2)
    assert not b.preempts or item.priority == "interactive"
    assert set(b.preempts) <= batch


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_placement_never_overcommits_gpus_slices_or_hosts(
        scenario: tuple[Cluster, list[PlacementRequest], list[PlacementRequest]]) -> None:
    cluster, first, second = scenario
    s = build_snapshot(cluster)
    for items in (first, second):
        decisions = place(s, items)
        assert decisions == place(s, items), "placement is deterministic"
        batch = {r.replica_id for r in s.reservations.values() if r.priority == "batch"}
        for item, d in zip(items, decisions, strict=True):
            assert d.replica_id == item.replica_id
            if isinstance(d, Binding):
                assert_binding_matches(cluster, item, d, batch)
        gone = sorted(s.reservations)[::3]  # some replicas stop while these start
        assert place_and_apply(s, items, gone) == (decisions, apply_decisions(s, decisions, gone))
        s = apply_decisions(s, decisions)
        assert_not_overcommitted(s)
        assert s == build_snapshot(cluster, s.reservations.values()), "incremental and rebuilt snapshots agree"
