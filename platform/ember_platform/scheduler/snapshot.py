"""The immutable picture placement decides on: nodes, their schedulable GPU slots, and reservations.

A *slot* is what one replica's GPU share lives on: a whole GPU, or one MIG slice (a GPU in MIG mode
is reached only through its slices). ``Cluster`` is built from the nodes' reported ``NodeInfo``;
``Snapshot`` adds the reservations of the replicas that exist and what they use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from ember.wire import Device, NodeInfo
from ember_platform.scheduler.index import FreeIndex, GroupKey
from ember_platform.scheduler.request import Priority

UNLIMITED = 1 << 60  # a node that does not report a host resource is not limited by it



class Slot(NamedTuple):
    sid: int
    nid: int
    gpu_index: int  # the GPU's index on its node
    uuid: str
    name: str
    total_mb: int
    mig_profile: str
    nvlink: frozenset[int]  # indices of GPUs on the node joined to this one over NVLink
    numa_node: int
    group: GroupKey  # (name, MIG profile, memory): slots that are interchangeable


class Node(NamedTuple):
    nid: int
    node_id: str
    cpu_millis: int
    memory_mb: int
    slots: tuple[int, ...]
    bundles: frozenset[str]
    volumes: frozenset[str] = frozenset()  # volume versions cached on the node (``name@vN``)
    environments: frozenset[str] = frozenset()  # image environments built on the node (their sha256)


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """What one existing replica holds. ``memory_mb`` is per GPU; 0 holds each GPU whole."""

    replica_id: str
    function: str
    node_id: str
    gpu_uuids: tuple[str, ...] = ()
    memory_mb: int = 0
    cpu_millis: int = 0
    host_memory_mb: int = 0
    priority: Priority = "interactive"


def tokens(name: str) -> frozenset[str]:
    """``"NVIDIA H100 80GB HBM3"`` → {NVIDIA, H100, 80GB, HBM3}: a type matches when all its tokens do."""
    return frozenset(t for t in re.split(r"[^A-Z0-9]+", name.upper()) if t)


@dataclass(frozen=True)
class Cluster:
    """Nodes and their slots, numbered in the order given. Ties go to the lower number: give the nodes in a
    stable order (sorted by node id, say) for decisions that do not depend on how they were listed."""

    nodes: tuple[Node, ...]
    slots: tuple[Slot, ...]
    node_index: Mapping[str, int]
    slot_index: Mapping[tuple[str, str], int]  # (node id, GPU uuid): uuids need only be unique per node
    groups: Mapping[GroupKey, tuple[int, ...]]  # slot ids per group, ascending
    group_nodes: Mapping[GroupKey, Mapping[int, tuple[int, ...]]]  # per group: node id -> its slot ids
    bundle_nodes: Mapping[str, tuple[int, ...]]
    _tiers: dict[tuple[tuple[str, ...], str], tuple[tuple[GroupKey, ...], ...]] = field(
        default_factory=dict, compare=False, repr=False)
    _slot_ids: dict[tuple[str, tuple[str, ...]], tuple[int, ...]] = field(
        default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_nodes(cls, infos: Iterable[NodeInfo]) -> Cluster:
        nodes: list[Node] = []
        slots: list[Slot] = []
        for nid, info in enumerate(infos):
            own = _symmetric([_slot(len(slots) + i, nid, d) for i, d in enumerate(_schedulable(info.devices))])
            slots.extend(own)
            nodes.append(Node(nid, info.node_id, _or_unlimited(info.cpu_cores * 1000),
                              _or_unlimited(info.memory_mb or _cpu_memory(info)), tuple(s.sid for s in own),
                              frozenset(info.bundles), frozenset(info.volumes), frozenset(info.environments)))
        groups: dict[GroupKey, list[int]] = {}
        bundles: dict[str, list[int]] = {}
        for slot in slots:
            groups.setdefault(slot.group, []).append(slot.sid)
        for node in nodes:
            for key in sorted(node.bundles | node.volumes | node.environments):
                bundles.setdefault(key, []).append(node.nid)
        return cls(tuple(nodes), tuple(slots), {n.node_id: n.nid for n in nodes},
                   {(nodes[s.nid].node_id, s.uuid): s.sid for s in slots},
                   {k: tuple(v) for k, v in groups.items()}, _by_node(slots, groups),
                   {k: tuple(v) for k, v in bundles.items()})

    def slot_ids(self, node_id: str, gpu_uuids: tuple[str, ...]) -> tuple[int, ...]:
        """The slots of these GPUs of one node (remembered: every snapshot of a pass asks again)."""
        key = (node_id, gpu_uuids)
        sids = self._slot_ids.get(key)
        if sids is None:
            sids = self._slot_ids[key] = tuple(self.slot_index[node_id, u] for u in gpu_uuids)
        return sids

    def tiers(self, types: tuple[str, ...], mig_profile: str) -> tuple[tuple[GroupKey, ...], ...]:
        """The slot groups a request may use, one tier per acceptable type in preference order."""
        key = (types, mig_profile)
        if key not in self._tiers:
            kinds = [g for g in self.groups if g[1] == mig_profile]
            wanted = [tokens(t) for t in types] or [frozenset()]
            self._tiers[key] = tuple(t for t in (tuple(g for g in kinds if w <= tokens(g[0])) for w in wanted) if t)
        return self._tiers[key]


def _by_node(slots: list[Slot], groups: dict[GroupKey, list[int]]) -> dict[GroupKey, dict[int, tuple[int, ...]]]:
    out: dict[GroupKey, dict[int, tuple[int, ...]]] = {}
    for key, sids in groups.items():
        per_node: dict[int, list[int]] = {}
        for sid in sids:
            per_node.setdefault(slots[sid].nid, []).append(sid)
        out[key] = {nid: tuple(s) for nid, s in per_node.items()}
    return out


def _symmetric(slots: list[Slot]) -> list[Slot]:
    """A link either end reports joins both ends."""
    peers: dict[int, set[int]] = {}
    for slot in slots:
        for other in slot.nvlink:
            peers.setdefault(slot.gpu_index, set()).add(other)
            peers.setdefault(other, set()).add(slot.gpu_index)
    return [s._replace(nvlink=frozenset(peers.get(s.gpu_index, ()))) for s in slots]


def _schedulable(devices: Iterable[Device]) -> list[Device]:
    return [d for d in devices if d.kind == "gpu" and not d.mig_enabled and d.memory_total_mb > 0 and not d.fault]


def _slot(sid: int, nid: int, d: Device) -> Slot:
    return Slot(sid, nid, d.index, d.uuid or f"gpu-{d.index}-{sid}", d.name, d.memory_total_mb, d.mig_profile,
                frozenset(d.nvlink_peers), d.numa_node, (d.name, d.mig_profile, d.memory_total_mb))


def _cpu_memory(info: NodeInfo) -> int:
    return sum(d.memory_total_mb for d in info.devices if d.kind == "cpu")


def _or_unlimited(value: int) -> int:
    return value if value > 0 else UNLIMITED


@dataclass(frozen=True)
class Snapshot:
    """A cluster and what its existing replicas hold. Build with ``snapshot()``; never mutated."""

    cluster: Cluster
    reservations: Mapping[str, Reservation]
    used_mb: tuple[int, ...]  # per slot
    used_cpu: tuple[int, ...]  # per node
    used_memory: tuple[int, ...]  # per node, host memory
    node_replicas: tuple[int, ...]  # per node
    on_node: Mapping[str, Mapping[int, int]]  # function -> {node id: replicas}
    on_slot: Mapping[str, Mapping[int, int]]  # function -> {slot id: replicas}
    by_node: Mapping[int, Mapping[str, Reservation]]  # node id -> {replica id: its reservation}
    crowded: Mapping[str, int]  # function -> nodes running two or more of its replicas (none: absent)
    orphans: tuple[Reservation, ...] = ()  # reservations on nodes or GPUs that are gone
    _index: list[Any] = field(default_factory=list, compare=False, repr=False)  # a cache: FreeIndex, once built

    def free_mb(self, sid: int) -> int:
        return self.cluster.slots[sid].total_mb - self.used_mb[sid]

    def free_index(self) -> FreeIndex:
        """The sorted free capacity of this snapshot (built once; callers change only copies)."""
        if not self._index:
            self._index.append(_free_index(self.cluster, self.used_mb, self.used_memory))
        index: FreeIndex = self._index[0]
        return index


def _free_index(cluster: Cluster, used_mb: Sequence[int], used_memory: Sequence[int]) -> FreeIndex:
    slots = {g: [(cluster.slots[s].total_mb - used_mb[s], s) for s in sids] for g, sids in cluster.groups.items()}
    hosts = [(bool(node.slots), node.memory_mb - used_memory[node.nid], node.nid) for node in cluster.nodes]
    return FreeIndex.build(slots, hosts)
