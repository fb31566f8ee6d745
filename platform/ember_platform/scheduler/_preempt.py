"""Room for an interactive replica by stopping batch-class replicas, as few and as small as possible.

Only nodes where the replica could fit with every batch replica gone are tried (a check that changes
nothing), those with the fewest batch replicas first, and at most ``_PLANS`` of them that work. On
each, its batch replicas are taken away, the best choice made, and then put back one by one,
smallest first, as long as the choice still fits: those that cannot go back are the victims.
"""

from __future__ import annotations

from typing import NamedTuple

from ember_platform.scheduler._fit import Choice, fit_on_node, need_mb, still_fits
from ember_platform.scheduler._request import PlacementRequest
from ember_platform.scheduler._snapshot import Reservation
from ember_platform.scheduler._usage import Usage

_PLANS = 8  # nodes planned that work, among those with the fewest batch replicas


class Plan(NamedTuple):
    victims: int
    victim_gb: float
    cost: float
    nid: int
    choice: Choice
    preempts: tuple[str, ...]


class BatchWork(NamedTuple):
    """Where batch-class replicas are: it changes only when one is preempted (batch replicas are placed last)."""

    by_node: dict[int, list[Reservation]]
    slot_mb: dict[int, int]  # slot id -> MB held by batch replicas
    cpu: dict[int, int]  # node id -> millicores held by batch replicas
    memory: dict[int, int]  # node id -> host MB held by batch replicas


def preempt(usage: Usage, item: PlacementRequest, batch: BatchWork) -> Plan | None:
    """The cheapest node on which stopping batch replicas lets ``item`` fit; ``usage`` is left as it was."""
    candidates = sorted((len(work), nid) for nid, work in batch.by_node.items() if _could_fit(usage, item, nid, batch))
    plans: list[Plan] = []
    index, usage.index = usage.index, None  # every change below is undone: the index stays valid
    try:
        for _, nid in candidates:
            plan = _plan(usage, item, nid, batch.by_node[nid])
            if plan is not None:
                plans.append(plan)
            if len(plans) >= _PLANS:
                break
    finally:
        usage.index = index
    return min(plans, default=None)


def batch_work(usage: Usage) -> BatchWork:
    out = BatchWork({}, {}, {}, {})
    for r in usage.reservations.values():
        if r.priority == "batch":
            _count(out, usage, r, 1)
    return out


def forget(batch: BatchWork, usage: Usage, replica_ids: tuple[str, ...]) -> None:
    """Drop preempted replicas from ``batch`` (call before they leave ``usage``)."""
    for replica_id in replica_ids:
        r = usage.reservations[replica_id]
        _count(batch, usage, r, -1)
        nid = usage.cluster.node_index[r.node_id]
        batch.by_node[nid] = [b for b in batch.by_node[nid] if b.replica_id != replica_id]
        if not batch.by_node[nid]:
            del batch.by_node[nid]


def _count(batch: BatchWork, usage: Usage, r: Reservation, sign: int) -> None:
    nid = usage.cluster.node_index[r.node_id]
    if sign > 0:
        batch.by_node.setdefault(nid, []).append(r)
    batch.cpu[nid] = batch.cpu.get(nid, 0) + sign * r.cpu_millis
    batch.memory[nid] = batch.memory.get(nid, 0) + sign * r.host_memory_mb
    for sid in usage.sids(r):
        batch.slot_mb[sid] = batch.slot_mb.get(sid, 0) + sign * (r.memory_mb or usage.cluster.slots[sid].total_mb)


def _could_fit(usage: Usage, item: PlacementRequest, nid: int, batch: BatchWork) -> bool:
    node = usage.cluster.nodes[nid]
    if (usage.used_cpu[nid] - batch.cpu.get(nid, 0) + item.cpu_millis > node.cpu_millis
            or usage.used_memory[nid] - batch.memory.get(nid, 0) + item.host_memory_mb > node.memory_mb):
        return False
    if item.gpu.cpu_only:
        return True
    groups = {g for tier in usage.cluster.tiers(item.gpu.types, item.gpu.mig_profile) for g in tier}
    slots = [usage.cluster.slots[s] for s in node.slots]
    room = [s for s in slots if s.group in groups
            and usage.free_mb(s.sid) + batch.slot_mb.get(s.sid, 0) >= need_mb(item, s.total_mb)]
    return len(room) >= item.gpu.count


def _plan(usage: Usage, item: PlacementRequest, nid: int, batch: list[Reservation]) -> Plan | None:
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
