"""Placement rules, one by one, on declared virtual inventories."""

from __future__ import annotations

import pytest
from support.placement import A10G, H100X2, held, node, req, snap

from ember.wire import NodeInfo
from ember_platform.scheduler import (
    Binding,
    Cluster,
    Snapshot,
    Unschedulable,
    apply_decisions,
    build_snapshot,
    place,
)
from ember_runtime.agent.inventory import parse


def bound(decision: object) -> Binding:
    assert isinstance(decision, Binding), decision
    return decision


# --- memory best-fit --------------------------------------------------------------------------------


def test_a_shared_replica_takes_the_smallest_hole_that_fits() -> None:
    s = snap(node("a", '[[gpu]]\nmodel = "H100-80GB"\ncount = 3\n'),
             reservations=(held("a", "GPU-a-0", 50 * 1024), held("a", "GPU-a-1", 20 * 1024)))
    (b,) = place(s, [req("r", "24GB")])
    assert bound(b).gpu_uuids == ("GPU-a-0",)  # 30 GB free: the tightest fit, the 60 GB and 80 GB holes stay


def test_best_fit_keeps_the_large_hole_for_a_whole_gpu() -> None:
    s = snap(node("a", '[[gpu]]\nmodel = "H100-80GB"\ncount = 2\n'), reservations=(held("a", "GPU-a-0", 10240),))
    small, whole = place(s, [req("r1", "10GB", function="g"), req("r2", 1, function="h")])
    assert (bound(small).gpu_uuids, bound(whole).gpu_uuids) == (("GPU-a-0",), ("GPU-a-1",))


def test_a_whole_gpu_of_any_type_is_the_smallest() -> None:
    s = snap(node("a", H100X2 + A10G))
    assert bound(place(s, [req("r", 1)])[0]).gpu_uuids == ("GPU-a-2",)


def test_types_are_taken_in_preference_order() -> None:
    s = snap(node("a", '[[gpu]]\nmodel = "A100-80GB"\n[[gpu]]\nmodel = "H100-80GB"\n'))
    first, second, third = place(s, [req("r1", ["H100", "A100"]), req("r2", ["H100", "A100"]),
                                     req("r3", ["H100", "A100"])])
    assert (bound(first).gpu_uuids, bound(second).gpu_uuids) == (("GPU-a-1",), ("GPU-a-0",))
    assert isinstance(third, Unschedulable)


def test_memory_shares_fill_a_gpu_exactly_and_no_further() -> None:
    s = snap(node("a", A10G))
    decisions = place(s, [req(f"r{i}", "8GB", function=f"f{i}") for i in range(4)])
    assert [isinstance(d, Binding) for d in decisions] == [True, True, True, False]


def test_a_node_in_use_is_preferred_to_opening_an_empty_one() -> None:
    s = snap(node("a", H100X2), node("b", H100X2), reservations=(held("b", "GPU-b-0", 70 * 1024),))
    first, second = place(s, [req("r1", "20GB", function="x"), req("r2", "20GB", function="y")])
    assert (bound(first).gpu_uuids, bound(second).gpu_uuids) == (("GPU-b-1",), ("GPU-b-1",))


# --- spread ---------------------------------------------------------------------------------------------


def test_a_function_s_replicas_spread_across_nodes() -> None:
    s = snap(*(node(n, H100X2) for n in "abc"))
    nodes = [bound(d).node_id for d in place(s, [req(f"r{i}", "10GB") for i in range(3)])]
    assert sorted(nodes) == ["a", "b", "c"]


def test_a_function_s_replicas_spread_across_gpus_of_one_node() -> None:
    s = snap(node("a", H100X2))
    gpus = {bound(d).gpu_uuids for d in place(s, [req(f"r{i}", "10GB") for i in range(2)])}
    assert gpus == {("GPU-a-0",), ("GPU-a-1",)}


def test_spread_gives_way_when_there_is_nowhere_else() -> None:
    s = snap(node("a", A10G))
    assert all(isinstance(d, Binding) for d in place(s, [req(f"r{i}", "10GB") for i in range(2)]))


# --- NVLink, NUMA, MIG ----------------------------------------------------------------------------------


PAIRS = 'nvlink = [[0, 1], [2, 3]]\n[[gpu]]\nmodel = "H100-80GB"\ncount = 4\n'


def test_a_multi_gpu_replica_gets_an_nvlink_clique() -> None:
    s = snap(node("a", PAIRS), reservations=(held("a", "GPU-a-0", 1024),))
    (b,) = place(s, [req("r", "H100:2:nvlink")])
    assert bound(b).gpu_indices == (2, 3)


def test_without_a_clique_an_nvlink_replica_is_unschedulable() -> None:
    (d,) = place(snap(node("a", PAIRS)), [req("r", "H100:3:nvlink")])
    assert isinstance(d, Unschedulable)
    assert d.reason == "no node has 3 NVLink-joined GPUs of type H100, even when idle"


def test_a_multi_gpu_replica_stays_on_one_numa_node() -> None:
    toml = '[[gpu]]\nmodel = "L4-24GB"\nnuma_node = 0\n' + '[[gpu]]\nmodel = "L4-24GB"\ncount = 2\nnuma_node = 1\n'
    s = snap(node("a", toml))
    b = bound(place(s, [req("r", 2)])[0])
    assert (b.gpu_indices, b.numa_node) == ((1, 2), 1)


MIG = '[[gpu]]\nmodel = "A100-80GB"\nmig = { "3g.40gb" = 1, "1g.10gb" = 4 }\n'


def test_mig_slices_are_matched_by_profile() -> None:
    decisions = place(snap(node("a", MIG)), [req("r1", "1g.10gb"), req("r2", "3g.40gb"), req("r3", "A100:1g.10gb")])
    profiles = [bound(d).gpu_uuids for d in decisions]
    assert profiles == [("MIG-a-0-1",), ("MIG-a-0-0",), ("MIG-a-0-2",)]


def test_mig_slices_run_out_and_a_mig_gpu_is_never_given_whole() -> None:
    decisions = place(snap(node("a", MIG)), [*(req(f"r{i}", "1g.10gb", function=f"f{i}") for i in range(5)),
                                             req("whole", "A100"), req("shared", "1GB")])
    assert [type(d).__name__ for d in decisions] == ["Binding"] * 4 + ["Unschedulable"] * 3
    assert isinstance(decisions[4], Unschedulable)
    assert decisions[4].reason.startswith("every node with a MIG slice 1g.10gb is full")


# --- locality -------------------------------------------------------------------------------------------


def test_a_node_caching_the_bundle_is_preferred() -> None:
    s = snap(node("a", H100X2), node("b", H100X2, bundles=("sha-f",)))
    assert bound(place(s, [req("r", "10GB", bundle="sha-f")])[0]).node_id == "b"


def test_locality_does_not_outweigh_a_much_better_fit() -> None:
    s = snap(node("a", A10G), node("b", H100X2, bundles=("sha-f",)))
    assert bound(place(s, [req("r", "20GB", bundle="sha-f")])[0]).node_id == "a"


# --- priority and preemption ----------------------------------------------------------------------------


def _full_of_batch() -> Snapshot:
    return snap(node("a", H100X2), reservations=(
        held("a", "GPU-a-0", 40960, function="b1", priority="batch"),
        held("a", "GPU-a-0", 20480, function="b2", priority="batch"),
        held("a", "GPU-a-1", 81920, function="i1"),
    ))


def test_an_interactive_replica_preempts_the_fewest_batch_replicas() -> None:
    (d,) = place(_full_of_batch(), [req("r", "50GB")])
    b = bound(d)
    assert (b.gpu_uuids, b.preempts) == (("GPU-a-0",), ("b1-GPU-a-0-40960",))


def test_a_whole_gpu_preempts_every_batch_replica_on_it() -> None:
    (d,) = place(_full_of_batch(), [req("r", "H100")])
    assert bound(d).preempts == ("b1-GPU-a-0-40960", "b2-GPU-a-0-20480")


def test_batch_work_never_preempts() -> None:
    (d,) = place(_full_of_batch(), [req("r", "50GB", priority="batch")])
    assert isinstance(d, Unschedulable)
    assert "no batch-class replicas" not in d.reason


def test_interactive_replicas_are_never_preempted() -> None:
    s = snap(node("a", A10G), reservations=(held("a", "GPU-a-0", 20480),))
    (d,) = place(s, [req("r", "10GB")])
    assert isinstance(d, Unschedulable)
    assert d.reason.endswith("no batch-class replicas to preempt would make room")


def test_interactive_replicas_go_first_within_a_pass() -> None:
    batch, interactive = place(snap(node("a", A10G)), [req("b", "A10G", priority="batch"), req("i", "A10G")])
    assert isinstance(batch, Unschedulable)
    assert bound(interactive).preempts == ()


def test_preempted_replicas_leave_the_next_snapshot() -> None:
    before = _full_of_batch()
    decisions = place(before, [req("r", "50GB")])
    after = apply_decisions(before, decisions)
    assert set(after.reservations) == {"b2-GPU-a-0-20480", "i1-GPU-a-1-81920", "r"}
    assert after.used_mb == (20480 + 51200, 81920)


# --- CPU-only replicas and host resources ----------------------------------------------------------------


def test_cpu_replicas_go_to_cpu_nodes_by_best_fit_on_host_memory() -> None:
    s = snap(node("gpu", H100X2), node("big", "", memory_gb=64), node("small", "", memory_gb=8))
    (b,) = place(s, [req("r", None, host_memory_mb=4096)])
    assert bound(b).node_id == "small"


def test_cpu_replicas_use_gpu_nodes_when_cpu_nodes_are_full() -> None:
    s = snap(node("gpu", H100X2), node("cpu", "", cpu=2))
    decisions = place(s, [req(f"r{i}", None, function=f"f{i}", cpu_millis=1000) for i in range(3)])
    assert [bound(d).node_id for d in decisions] == ["cpu", "cpu", "gpu"]


def test_host_memory_is_counted_for_gpu_replicas() -> None:
    s = snap(node("a", H100X2, memory_gb=4), node("b", H100X2))
    decisions = place(s, [req("r1", "10GB", function="x", host_memory_mb=3072),
                          req("r2", "10GB", function="y", host_memory_mb=3072)])
    assert {bound(d).node_id for d in decisions} == {"a", "b"}


def test_a_cpu_replica_that_fits_nowhere_says_what_it_needs() -> None:
    (d,) = place(snap(node("cpu", "", cpu=1)), [req("r", None, cpu_millis=2000)])
    assert isinstance(d, Unschedulable)
    assert d.reason == "no node has 2000 millicores and 1024 MB of host memory free"


# --- bookkeeping ---------------------------------------------------------------------------------------


def test_placement_is_deterministic_and_leaves_the_snapshot_alone() -> None:
    s = snap(*(node(n, H100X2 + A10G + MIG) for n in "abcd"))
    items = [req(f"r{i}", g, function=f"f{i % 3}") for i, g in
             enumerate(["10GB", 1, "H100:2:nvlink", "1g.10gb", None, "24GB", "A10G", "3g.40gb"] * 3)]
    before = (s.used_mb, s.used_cpu, dict(s.reservations))
    assert place(s, items) == place(s, items)
    assert (s.used_mb, s.used_cpu, dict(s.reservations)) == before


def test_a_replica_already_placed_is_not_placed_twice() -> None:
    s = snap(node("a", A10G), reservations=(held("a", "GPU-a-0", 1024, replica_id="r"),))
    (d,) = place(s, [req("r", "1GB")])
    assert isinstance(d, Unschedulable)
    assert d.reason == "replica 'r' is already placed"


def test_gpu_uuids_need_only_be_unique_per_node() -> None:
    twins = [NodeInfo(node_id=n, hostname=n, devices=parse(A10G), updated_at=0.0) for n in "ab"]
    assert twins[0].devices == twins[1].devices  # both "GPU-virtual-0"
    s = build_snapshot(Cluster.from_nodes(twins), [held("b", "GPU-virtual-0", 20480)])
    assert s.used_mb == (0, 20480)
    assert bound(place(s, [req("r", "10GB")])[0]).node_id == "a"


def test_reservations_on_vanished_nodes_are_orphans() -> None:
    gone = held("z", "GPU-z-0", 1024)
    s = snap(node("a", A10G), reservations=(gone, held("a", "GPU-a-9", 1024)))
    assert len(s.orphans) == 2 and s.orphans[0] == gone
    assert s.used_mb == (0,)


@pytest.mark.parametrize(("gpu", "reason"), [
    ("B200", "no node has a GPU of type B200, even when idle"),
    ("H100:4", "no node has 4 GPUs of type H100, even when idle"),
    ("2g.20gb", "no node has a MIG slice 2g.20gb, even when idle"),
    ("H100:96GB", "no node has a GPU of type H100 with 98304 MB free, even when idle"),
])
def test_unschedulable_reasons_name_the_missing_hardware(gpu: str, reason: str) -> None:
    (d,) = place(snap(node("a", H100X2)), [req("r", gpu)])
    assert isinstance(d, Unschedulable) and d.reason == reason


def test_a_node_that_built_the_image_environment_is_preferred() -> None:
    built = NodeInfo(node_id="b", hostname="b", devices=parse('[host]\nname = "b"\n'), updated_at=0.0, cpu_cores=64,
                     memory_mb=512 * 1024, environments=["e" * 64])
    s = snap(node("a", ""), built)
    assert bound(place(s, [req("r", environment="e" * 64)])[0]).node_id == "b"
    assert bound(place(s, [req("r", environment="f" * 64)])[0]).node_id == "a"  # another image: no pull to b
