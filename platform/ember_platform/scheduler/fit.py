"""Filter and score: where one replica fits best, given what is used now.

Costs are in GB-equivalents, lower is better, ties broken by node then slot id:

- the memory a choice leaves unused on a GPU it shares (best-fit keeps large holes free), or, for a
  whole GPU, its size (a small GPU is taken before a large one);
- ``SPREAD`` for each replica of the same function already on the node, and again on the GPU;
- minus ``LOCALITY`` on a node that caches the replica's bundle or snapshot, ``VOLUME_LOCALITY`` for each
  volume it mounts that the node caches (a volume is fetched once per node, and may weigh gigabytes), and
  ``ENV_LOCALITY`` on a node that built its image's environment (built once per node);
- ``OPEN_NODE`` on a node that runs nothing yet (whole empty nodes are kept for replicas that
  need many GPUs);
- ``NUMA_SPLIT`` for a multi-GPU replica whose GPUs sit on different NUMA nodes.

Acceptable GPU types are tiers: a later type is used only when no earlier one fits. The GPUs of a
multi-GPU replica are of one kind (same name and memory) and on one node.
"""

from __future__ import annotations

from itertools import combinations
from typing import NamedTuple

from ember_platform.scheduler.index import FreeIndex
from ember_platform.scheduler.request import PlacementRequest
from ember_platform.scheduler.reservations import Usage
from ember_platform.scheduler.snapshot import UNLIMITED, Cluster, GroupKey

SPREAD = 1000.0
LOCALITY = 8.0
VOLUME_LOCALITY = 8.0
ENV_LOCALITY = 8.0
OPEN_NODE = 16.0
NUMA_SPLIT = 1.0
_WALK = 32  # candidates looked at per slot group once one fits (until then, all are)
_LOCAL_NODES = 16  # nodes caching the bundle looked at besides


class Choice(NamedTuple):
    cost: float
    nid: int
    sids: tuple[int, ...]


# --- one replica ----------------------------------------------------------------------------------


def fit(usage: Usage, item: PlacementRequest) -> Choice | None:
    """The best place for ``item`` without displacing anything, or ``None`` (``usage`` keeps an index)."""
    index = usage.index
    if index is None:
        raise ValueError("fit() needs a Usage that keeps a FreeIndex")
    if item.gpu.cpu_only:
        return _fit_host(usage, index, item)
    for tier in usage.cluster.tiers(item.gpu.types, item.gpu.mig_profile):
        choice = (_fit_single(usage, index, item, tier) if item.gpu.count == 1
                  else _fit_multi(usage, index, item, tier))
        if choice is not None:
            return choice
    return None


def fit_on_node(usage: Usage, item: PlacementRequest, nid: int) -> Choice | None:
    """The best place for ``item`` on one node (any tier), or ``None``."""
    if not usage.host_fits(nid, item.cpu_millis, item.host_memory_mb):
        return None
    if item.gpu.cpu_only:
        return Choice(_node_cost(usage, item, nid), nid, ())
    for tier in usage.cluster.tiers(item.gpu.types, item.gpu.mig_profile):
        options = [c for g in tier if (c := _fit_group_on_node(usage, item, nid, g)) is not None]
        if options:
            return min(options)
    return None


def still_fits(usage: Usage, item: PlacementRequest, choice: Choice) -> bool:
    slots = usage.cluster.slots
    return (usage.host_fits(choice.nid, item.cpu_millis, item.host_memory_mb)
            and all(usage.free_mb(s) >= need_mb(item, slots[s].total_mb) for s in choice.sids))


def need_mb(item: PlacementRequest, total_mb: int) -> int:
    return total_mb if item.gpu.exclusive else item.gpu.memory_mb


def _fit_single(usage: Usage, index: FreeIndex, item: PlacementRequest, tier: tuple[GroupKey, ...]) -> Choice | None:
    best: Choice | None = None
    for group in tier:
        need = need_mb(item, group[2])
        for seen, (free, sid) in enumerate(index.slots_from(group, need)):  # local nodes are looked at below
            if best is not None and (seen >= _WALK or _waste_gb(item, group[2], free) >= best.cost):
                break
            best = _better(best, _single(usage, item, sid))
    for nid in _local_nodes(usage, item):
        for sid in usage.cluster.nodes[nid].slots:
            if usage.cluster.slots[sid].group in tier:
                best = _better(best, _single(usage, item, sid))
    return best


def _single(usage: Usage, item: PlacementRequest, sid: int) -> Choice | None:
    slot = usage.cluster.slots[sid]
    free = usage.free_mb(sid)
    if free < need_mb(item, slot.total_mb) or not usage.host_fits(slot.nid, item.cpu_millis, item.host_memory_mb):
        return None
    return Choice(_slot_cost(usage, item, sid, free) + _node_cost(usage, item, slot.nid), slot.nid, (sid,))


def _fit_multi(usage: Usage, index: FreeIndex, item: PlacementRequest, tier: tuple[GroupKey, ...]) -> Choice | None:
    """Only nodes with enough slots that have room are looked at: the index lists those slots."""
    best: Choice | None = None
    slots = usage.cluster.slots
    for group in tier:
        room: dict[int, int] = {}
        for _, sid in index.slots_from(group, need_mb(item, group[2])):
            nid = slots[sid].nid
            room[nid] = room.get(nid, 0) + 1
        for nid, count in room.items():
            if count >= item.gpu.count and usage.host_fits(nid, item.cpu_millis, item.host_memory_mb):
                best = _better(best, _fit_group_on_node(usage, item, nid, group))
    return best


def _fit_group_on_node(usage: Usage, item: PlacementRequest, nid: int, group: GroupKey) -> Choice | None:
    sids = usage.cluster.group_nodes[group].get(nid, ())
    need = need_mb(item, group[2])
    ranked = sorted((_slot_cost(usage, item, s, usage.free_mb(s)), s) for s in sids if usage.free_mb(s) >= need)
    chosen = choose_slots(usage.cluster, ranked, item.gpu.count, item.gpu.topology == "nvlink")
    if chosen is None:
        return None
    return Choice(chosen[0] + _node_cost(usage, item, nid), nid, chosen[1])


def choose_slots(cluster: Cluster, ranked: list[tuple[float, int]], count: int,
                 nvlink: bool) -> tuple[float, tuple[int, ...]] | None:
    """The cheapest ``count`` slots of one node: an NVLink clique if asked, one NUMA node if possible."""
    if len(ranked) < count:
        return None
    if nvlink:
        return next(((sum(c for c, _ in combo), tuple(s for _, s in combo)) for combo in combinations(ranked, count)
                     if _clique(cluster, [s for _, s in combo])), None)
    by_numa: dict[int, list[tuple[float, int]]] = {}
    for entry in ranked:
        by_numa.setdefault(cluster.slots[entry[1]].numa_node, []).append(entry)
    whole = [_take(entries, count) for entries in by_numa.values() if len(entries) >= count]
    split = _take(ranked, count)
    return min([*whole, (split[0] + NUMA_SPLIT, split[1])])


def _take(ranked: list[tuple[float, int]], count: int) -> tuple[float, tuple[int, ...]]:
    return sum(c for c, _ in ranked[:count]), tuple(s for _, s in ranked[:count])


def _clique(cluster: Cluster, sids: list[int]) -> bool:
    slots = [cluster.slots[s] for s in sids]
    return all(b.gpu_index in a.nvlink for a, b in combinations(slots, 2))


def _fit_host(usage: Usage, index: FreeIndex, item: PlacementRequest) -> Choice | None:
    """CPU-only replicas: CPU-only nodes first, best-fit by host memory; then GPU nodes."""
    for gpu_nodes in (False, True):
        best: Choice | None = None
        for seen, (free, nid) in enumerate(index.hosts_from(gpu_nodes, item.host_memory_mb)):
            waste = _host_waste_gb(free - item.host_memory_mb)
            if best is not None and (seen >= _WALK
                                     or waste - LOCALITY - VOLUME_LOCALITY * len(item.volumes) - ENV_LOCALITY
                                     >= best.cost):
                break
            if usage.host_fits(nid, item.cpu_millis, item.host_memory_mb):
                best = _better(best, Choice(waste + _node_cost(usage, item, nid), nid, ()))
        if best is not None:
            return best
    return None


def _host_waste_gb(free_after_mb: int) -> float:
    return 0.0 if free_after_mb >= UNLIMITED // 2 else free_after_mb / 1024


def _waste_gb(item: PlacementRequest, total_mb: int, free_mb: int) -> float:
    return (total_mb if item.gpu.exclusive else free_mb - item.gpu.memory_mb) / 1024


def _slot_cost(usage: Usage, item: PlacementRequest, sid: int, free_mb: int) -> float:
    waste = _waste_gb(item, usage.cluster.slots[sid].total_mb, free_mb)
    return waste + SPREAD * usage.replicas_on_slot(item.function, sid)


def _node_cost(usage: Usage, item: PlacementRequest, nid: int) -> float:
    node = usage.cluster.nodes[nid]
    local = bool(item.bundle) and item.bundle in node.bundles
    volumes = sum(1 for v in item.volumes if v in node.volumes) if item.volumes and node.volumes else 0
    built = bool(item.environment) and item.environment in node.environments
    opens = 0.0 if usage.node_replicas[nid] else OPEN_NODE
    return SPREAD * usage.replicas_on_node(item.function, nid) - (LOCALITY if local else 0.0) \
        - VOLUME_LOCALITY * volumes - (ENV_LOCALITY if built else 0.0) + opens


def _local_nodes(usage: Usage, item: PlacementRequest) -> list[int]:
    """The nodes caching the replica's bundle or one of its volumes, looked at besides the best fits."""
    found = list(usage.cluster.bundle_nodes.get(item.bundle, ())[:_LOCAL_NODES])
    for key in (*item.volumes, *((item.environment,) if item.environment else ())):
        found += [n for n in usage.cluster.bundle_nodes.get(key, ())[:_LOCAL_NODES] if n not in found]
    return found


def _better(best: Choice | None, other: Choice | None) -> Choice | None:
    if other is None:
        return best
    return other if best is None or other < best else best
