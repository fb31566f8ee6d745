"""A node's zygotes give way to the host memory its replicas reserved (``memory=``): the preloader's budget for a
node is its share of the node's memory (``EMBER_ZYGOTE_MEMORY_FRACTION``) and never more than the replicas placed
there left, so that a cache of preloaded snapshots cannot push a node past its memory. And none is kept for GPU
replicas on a node that forks none of them (``NodeInfo.gpu_forks`` false, from an agent that cannot build a zygote
that holds GPUs: ``NodeInfo.gpu_zygotes``), where it would hold that memory for nothing."""

from __future__ import annotations

import msgspec
from support.builders import deployment, service_spec
from support.placement import A10G, node, snap

from ember.wire import SlotAssignment
from ember_platform.control.preloader import DEFAULT_ZYGOTE_MB, Preloader, zygote_budget_mb


def _reserving(mb: int) -> SlotAssignment:
    """A replica of another app on the node, with ``mb`` of host memory reserved."""
    return SlotAssignment(replica_id=f"b-big-{mb}", app="b", service="big", version=1, index=0, host_memory_mb=mb)


def _zygotes(plan: dict[str, list[SlotAssignment]]) -> list[str]:
    n1 = node("n1", A10G, memory_gb=16)
    dep = deployment(service_spec("s", snap=True, min_replicas=1))
    zygotes = Preloader(demand=lambda app, svc: 0.0).zygotes(plan, {"n1": n1}, {"a": dep}, lambda: snap(n1), now=0.0)
    return [f"{z.app}.{z.service}" for z in zygotes.get("n1", [])]


def test_the_budget_is_the_nodes_share_until_replicas_reserve_more() -> None:
    n1 = node("n1", A10G, memory_gb=16)  # 16,384 MB; a quarter is 4,096
    assert zygote_budget_mb(n1, []) == 4096
    assert zygote_budget_mb(n1, [_reserving(10_000)]) == 4096
    assert zygote_budget_mb(n1, [_reserving(10_000), _reserving(4_000)]) == 2384
    assert zygote_budget_mb(n1, [_reserving(20_000)]) == 0  # reserved past the node's memory: none, never negative


def test_a_zygote_goes_where_replicas_left_room_and_not_where_they_reserved_it() -> None:
    assert _zygotes({}) == ["a.s"]
    assert _zygotes({"n1": [_reserving(16_384 - 4096)]}) == ["a.s"]  # the share is left whole
    assert _zygotes({"n1": [_reserving(16_384 - DEFAULT_ZYGOTE_MB + 1)]}) == []  # a zygote's 1 GiB is not left


def _zygote_nodes(gpu: int, gpu_forks: bool, gpu_zygotes: bool = False) -> dict[str, list[str]]:
    """The nodes that keep a zygote of a snap service asking for ``gpu`` GPUs, with the GPUs each holds, on two
    nodes whose GPU replicas may fork from a zygote or not (``NodeInfo.gpu_forks``) and whose agents can build a
    zygote holding GPUs or not (``NodeInfo.gpu_zygotes``)."""
    nodes = {nid: msgspec.structs.replace(node(nid, A10G, memory_gb=16), gpu_forks=gpu_forks, gpu_zygotes=gpu_zygotes)
             for nid in ("n1", "n2")}
    dep = deployment(service_spec("s", snap=True, min_replicas=1, gpu_count=gpu))
    zygotes = Preloader(demand=lambda app, svc: 0.0).zygotes({}, nodes, {"a": dep}, lambda: snap(*nodes.values()),
                                                             now=0.0)
    return {nid: z.gpus for nid, kept in sorted(zygotes.items()) for z in kept}


def test_no_zygote_is_kept_for_gpu_replicas_on_a_node_that_forks_none() -> None:
    # a node whose sandboxes bind their GPUs' device nodes, and whose agent builds zygotes without any, starts its
    # GPU replicas fresh
    assert _zygote_nodes(1, gpu_forks=False) == {}
    assert _zygote_nodes(1, gpu_forks=True) == {"n1": [], "n2": []}  # a node without sandboxes: the node's devices
    assert _zygote_nodes(0, gpu_forks=False) == {"n1": [], "n2": []}  # a CPU replica forks in its sandbox
    # an agent that builds a zygote's sandbox with GPUs is told which: those its next replica there would get
    assert _zygote_nodes(1, gpu_forks=False, gpu_zygotes=True) == {"n1": ["GPU-n1-0"], "n2": ["GPU-n2-0"]}
