"""Room for an interactive replica by stopping batch-class replicas, as few and as small as possible.

Only nodes that have the replica's kind of GPU and where it could fit with every batch replica gone are
tried (a check that changes nothing), those with the fewest batch replicas first, and at most ``_PLANS``
of them that work; a node's batch work is gathered when it is first looked at. On each
(``plan_on_node``), its batch replicas are taken away, the best choice made, and then put back one by
one, smallest first, as long as the choice still fits: those that cannot go back are the victims.
Rebalancing plans its moves the same way, with the replicas it may move in place of batch work.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from ember_platform.scheduler.fit import Choice, fit_on_node, need_mb, still_fits
from ember_platform.scheduler.request import PlacementRequest
from ember_platform.scheduler.reservations import Usage
from ember_platform.scheduler.snapshot import GroupKey, Reservation

_PLANS = 8  # nodes planned that work, among those with the fewest batch replicas


class Plan(NamedTuple):
    victims: int
    victim_gb: float
    cost: float
    nid: int
    choice: Choice
    preempts: tuple[str, ...]


class NodeBatch(NamedTuple):
    """Some replicas of one node (its batch-class ones, say) and what they hold together."""

    replicas: list[Reservation]
    slot_mb: dict[int, int]  # slot id -> MB they hold
    cpu: int  # millicores
    memory: int  # host MB


BatchWork = dict[int, NodeBatch]  # node id -> its batch work, gathered as nodes are looked at in one pass


def preempt(usage: Usage, item: PlacementRequest, batch: BatchWork) -> Plan | None:
    """The cheapest node on which stopping batch replicas lets ``item`` fit; ``usage`` is left as it was."""
    groups = groups_of(usage, item)
    works = ((nid, batch_on(usage, batch, nid)) for nid in _nodes_for(usage, item, groups))
    candidates = sorted((len(work.replicas), nid) for nid, work in works if work.replicas)
    plans: list[Plan] = []
    index, usage.index = usage.index, None  # every change below is undone: the index stays valid
    try:
        for _, nid in candidates:
            if not could_fit(usage, item, nid, batch[nid], groups):
                continue
            plan = plan_on_node(usage, item, nid, batch[nid].replicas)
            if plan is not None:
                plans.append(plan)
            if len(plans) >= _PLANS:
                break
    finally:
        usage.index = index
    return min(plans, default=None)


def batch_on(usage: Usage, batch: BatchWork, nid: int) -> NodeBatch:
    """The batch work of node ``nid``, from ``batch`` or gathered now (batch replicas are placed last in a pass,
    so only preemption changes it)."""
    work = batch.get(nid)
    if work is None:
        work = batch[nid] = gather(usage, [r for r in usage.by_node.get(nid, {}).values() if r.priority == "batch"])
    return work


def gather(usage: Usage, replicas: list[Reservation]) -> NodeBatch:
    """What ``replicas`` (all on one node) hold together."""
    slot_mb: dict[int, int] = {}
    for r in replicas:
        for sid in usage.sids(r):
            slot_mb[sid] = slot_mb.get(sid, 0) + (r.memory_mb or usage.cluster.slots[sid].total_mb)
    return NodeBatch(replicas, slot_mb, sum(r.cpu_millis for r in replicas), sum(r.host_memory_mb for r in replicas))


def forget(batch: BatchWork, usage: Usage, replica_ids: tuple[str, ...]) -> None:
    """Drop the nodes of preempted replicas from ``batch``: gathered again, once they are gone, if looked at."""
    for replica_id in replica_ids:
        batch.pop(usage.cluster.node_index[usage.reservations[replica_id].node_id], None)


def _nodes_for(usage: Usage, item: PlacementRequest, groups: set[GroupKey]) -> Iterable[int]:
    """Nodes that have the GPUs ``item`` may use (any node with replicas for a CPU-only one)."""
    if item.gpu.cpu_only:
        return usage.by_node.keys()
    group_nodes = usage.cluster.group_nodes
    return {nid for g in groups for nid, sids in group_nodes[g].items() if len(sids) >= item.gpu.count}


def groups_of(usage: Usage, item: PlacementRequest) -> set[GroupKey]:
    """The slot groups ``item`` may use, all tiers together."""
    return {g for tier in usage.cluster.tiers(item.gpu.types, item.gpu.mig_profile) for g in tier}


def could_fit(usage: Usage, item: PlacementRequest, nid: int, work: NodeBatch, groups: set[GroupKey]) -> bool:
    """Whether ``item`` would fit on the node with all of ``work`` gone (changes nothing)."""
    node = usage.cluster.nodes[nid]
    if (usage.used_cpu[nid] - work.cpu + item.cpu_millis > node.cpu_millis
            or usage.used_memory[nid] - work.memory + item.host_memory_mb > node.memory_mb):
        return False
    if item.gpu.cpu_only:
        return True
    slots = usage.cluster.slots
    room = sum(1 for sid in node.slots if slots[sid].group in groups
               and usage.free_mb(sid) + work.slot_mb.get(sid, 0) >= need_mb(item, slots[sid].total_mb))
    return room >= item.gpu.count


def plan_on_node(usage: Usage, item: PlacementRequest, nid: int, batch: list[Reservation]) -> Plan | None:
    """The fewest, smallest of ``batch`` (replicas on node ``nid``) whose leaving lets ``item`` fit there, and
    where it then goes; ``None`` if it does not fit even with all of them gone. ``usage`` is left as it was."""
    for r in batch:
        usage.remove(r.replica_id)
    choice = fit_on_node(usage, item, nid)
    victims = []
    for r in sorted(batch, key=lambda r: (_size_gb(usage, r), r.replica_id)):  # keep the most, smallest first
        usage.add(r)
        if choice is not None and not still_fits(usage, item, choice):
            usage.remove(r.replica_id)
            victims.append(r)
    for r in victims:
        usage.add(r)
    if choice is None:
        return None
    return Plan(len(victims), sum(_size_gb(usage, r) for r in victims), choice.cost, nid, choice,
                tuple(sorted(r.replica_id for r in victims)))


def _size_gb(usage: Usage, r: Reservation) -> float:
    slots = usage.cluster.slots
    return sum(r.memory_mb or slots[s].total_mb for s in usage.sids(r)) / 1024 + r.host_memory_mb / (1024 * 1024)
