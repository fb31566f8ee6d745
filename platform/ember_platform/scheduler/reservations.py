"""Mutable accounting of what reservations use; private to one ``snapshot()``, ``apply()`` or ``place()``.

It starts from copies of a snapshot's tuples, so the snapshot itself never changes. The per-function
and per-node maps are copied on write: a pass that touches ten functions copies ten small dicts, not
ten thousand.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any, TypeVar

from ember_platform.scheduler.index import FreeIndex
from ember_platform.scheduler.snapshot import Cluster, Reservation, Snapshot


class Usage:
    """Counters that follow every ``add`` and ``remove``, and keep ``index`` (if given) in step."""

    def __init__(self, snapshot: Snapshot, index: FreeIndex | None = None) -> None:
        self.cluster = snapshot.cluster
        self.index = index
        self.reservations = _copy(snapshot.reservations)
        self.used_mb = list(snapshot.used_mb)
        self.used_cpu = list(snapshot.used_cpu)
        self.used_memory = list(snapshot.used_memory)
        self.node_replicas = list(snapshot.node_replicas)
        # The inner dicts are the snapshot's until ``_own`` replaces them by copies, before any change.
        self.on_node: dict[str, dict[int, int]] = _copy(snapshot.on_node)  # type: ignore[arg-type]
        self.on_slot: dict[str, dict[int, int]] = _copy(snapshot.on_slot)  # type: ignore[arg-type]
        self.by_node: dict[int, dict[str, Reservation]] = _copy(snapshot.by_node)  # type: ignore[arg-type]
        self.crowded = _copy(snapshot.crowded)
        self._owned: tuple[set[str], set[str], set[int]] = (set(), set(), set())

    @classmethod
    def empty(cls, cluster: Cluster) -> Usage:
        nodes = (0,) * len(cluster.nodes)
        return cls(Snapshot(cluster, {}, (0,) * len(cluster.slots), nodes, nodes, nodes, {}, {}, {}, {}))

    def freeze(self, orphans: tuple[Reservation, ...] = ()) -> Snapshot:
        """An immutable snapshot of the counters; this ``Usage`` must not be used afterwards."""
        tables: tuple[dict[Any, Any], ...] = (self.on_node, self.on_slot, self.by_node)
        owned_keys: tuple[set[Any], ...] = self._owned
        for table, owned in zip(tables, owned_keys, strict=True):
            for key in owned:
                if not table.get(key, True):
                    del table[key]
        return Snapshot(self.cluster, self.reservations, tuple(self.used_mb), tuple(self.used_cpu),
                        tuple(self.used_memory), tuple(self.node_replicas), self.on_node, self.on_slot, self.by_node,
                        self.crowded, orphans, [self.index] if self.index is not None else [])

    def known(self, r: Reservation) -> bool:
        """Whether the node and every GPU of ``r`` exist in the cluster."""
        slots = self.cluster.slot_index
        return r.node_id in self.cluster.node_index and all((r.node_id, u) in slots for u in r.gpu_uuids)

    def add(self, r: Reservation) -> None:
        self.remove(r.replica_id)
        self.reservations[r.replica_id] = r
        self._account(r, 1)

    def remove(self, replica_id: str) -> Reservation | None:
        r = self.reservations.pop(replica_id, None)
        if r is not None:
            self._account(r, -1)
        return r

    def sids(self, r: Reservation) -> tuple[int, ...]:
        return self.cluster.slot_ids(r.node_id, r.gpu_uuids)

    def _account(self, r: Reservation, sign: int) -> None:
        nid = self.cluster.node_index[r.node_id]
        self.used_cpu[nid] += sign * r.cpu_millis
        self.used_memory[nid] += sign * r.host_memory_mb
        self.node_replicas[nid] += sign
        held = _own(self.by_node, self._owned[2], nid)
        if sign > 0:
            held[r.replica_id] = r
        else:
            held.pop(r.replica_id, None)
        here = _bump(_own(self.on_node, self._owned[0], r.function), nid, sign)
        if (sign > 0 and here == 2) or (sign < 0 and here == 1):  # the node just became, or stopped being, crowded
            _bump(self.crowded, r.function, sign)
        for sid in self.sids(r):
            self.used_mb[sid] += sign * (r.memory_mb or self.cluster.slots[sid].total_mb)
            _bump(_own(self.on_slot, self._owned[1], r.function), sid, sign)
            if self.index is not None:
                self.index.set_slot(self.cluster.slots[sid].group, sid, self.free_mb(sid))
        if self.index is not None:
            self.index.set_host(bool(self.cluster.nodes[nid].slots), nid,
                                self.cluster.nodes[nid].memory_mb - self.used_memory[nid])

    # --- questions placement asks --------------------------------------------------------------

    def free_index(self) -> FreeIndex:
        if self.index is None:
            raise ValueError("this Usage keeps no FreeIndex")
        return self.index

    def free_mb(self, sid: int) -> int:
        return self.cluster.slots[sid].total_mb - self.used_mb[sid]

    def host_fits(self, nid: int, cpu_millis: int, memory_mb: int) -> bool:
        node = self.cluster.nodes[nid]
        return (self.used_cpu[nid] + cpu_millis <= node.cpu_millis
                and self.used_memory[nid] + memory_mb <= node.memory_mb)

    def replicas_on_node(self, function: str, nid: int) -> int:
        return self.on_node.get(function, {}).get(nid, 0)

    def replicas_on_slot(self, function: str, sid: int) -> int:
        return self.on_slot.get(function, {}).get(sid, 0)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Hashable)
W = TypeVar("W")


def _copy(mapping: Mapping[K, W]) -> dict[K, W]:
    """A dict's own ``copy()`` clones its table, where ``dict(d)`` re-inserts every key once ``d`` has had one
    deleted: the difference is most of the cost of a ``Usage`` over 10^4 replicas."""
    return mapping.copy() if isinstance(mapping, dict) else dict(mapping)


def _own(table: dict[K, dict[V, W]], owned: set[K], key: K) -> dict[V, W]:
    """The entry under ``key`` (a function's counts, a node's replicas), copied the first time this ``Usage``
    changes it."""
    if key not in owned:
        owned.add(key)
        table[key] = dict(table.get(key, {}))
    return table[key]


def _bump(counts: dict[K, int], key: K, sign: int) -> int:
    value = counts.get(key, 0) + sign
    if value:
        counts[key] = value
    else:
        counts.pop(key, None)
    return value


def build_snapshot(cluster: Cluster, reservations: Iterable[Reservation] = ()) -> Snapshot:
    """The snapshot of ``cluster`` with these replicas; those on unknown nodes or GPUs become ``orphans``. An orphan
    on a known node (its GPU out of service, or gone) still runs there until it is replaced: its host memory and CPU
    stay counted on that node, so that its replacement is not placed beside it in memory it still holds."""
    usage = Usage.empty(cluster)
    orphans = []
    for r in reservations:
        if usage.known(r):
            usage.add(r)
        else:
            orphans.append(r)
            if (nid := cluster.node_index.get(r.node_id)) is not None:
                usage.used_cpu[nid] += r.cpu_millis
                usage.used_memory[nid] += r.host_memory_mb
    return usage.freeze(tuple(orphans))


def apply(before: Snapshot, added: Iterable[Reservation], removed: Iterable[str] = ()) -> Snapshot:
    """The snapshot after replicas ``removed`` stop and ``added`` start (its orphans are kept)."""
    usage = Usage(before, before.free_index().copy() if before._index else None)
    for replica_id in removed:
        usage.remove(replica_id)
    for r in added:
        if usage.known(r):
            usage.add(r)
    return usage.freeze(before.orphans)
