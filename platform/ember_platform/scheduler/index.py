"""Free capacity kept sorted, so that best-fit is a bisect rather than a scan of every GPU.

Per slot group, ``(free MB, slot id)`` ascending; per node kind (with or without GPUs),
``(free host MB, node id)``. A snapshot keeps one, built on first use; ``place`` works on a copy and
``apply`` hands the next snapshot a copy updated where it changed.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping

GroupKey = tuple[str, str, int]  # (device name, MIG profile or "", memory MB): interchangeable slots


class FreeIndex:
    def __init__(self, slots: dict[GroupKey, list[tuple[int, int]]], hosts: dict[bool, list[tuple[int, int]]],
                 slot_key: dict[int, int], host_key: dict[int, int]) -> None:
        self._slots = slots
        self._hosts = hosts
        self._slot_key = slot_key
        self._host_key = host_key

    @classmethod
    def build(cls, slot_free: Mapping[GroupKey, Iterable[tuple[int, int]]],
              host_free: Iterable[tuple[bool, int, int]]) -> FreeIndex:
        """From ``(free MB, slot id)`` per slot group and ``(has GPUs, free host MB, node id)`` per node."""
        slots = {g: sorted(entries) for g, entries in slot_free.items()}
        hosts: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        for has_gpus, free, nid in host_free:
            hosts[has_gpus].append((free, nid))
        for entries in hosts.values():
            entries.sort()
        return cls(slots, hosts, {s: free for entries in slots.values() for free, s in entries},
                   {nid: free for entries in hosts.values() for free, nid in entries})

    def copy(self) -> FreeIndex:
        return FreeIndex({g: list(e) for g, e in self._slots.items()}, {k: list(e) for k, e in self._hosts.items()},
                         dict(self._slot_key), dict(self._host_key))

    def slots_from(self, group: GroupKey, need_mb: int) -> Iterator[tuple[int, int]]:
        """``(free MB, slot id)`` of the group with at least ``need_mb`` free, tightest first."""
        entries = self._slots[group]
        for i in range(bisect_left(entries, (need_mb, -1)), len(entries)):
            yield entries[i]

    def slots_below(self, group: GroupKey, need_mb: int) -> Iterator[tuple[int, int]]:
        """``(free MB, slot id)`` of the group with less than ``need_mb`` free, the closest to it first."""
        entries = self._slots[group]
        for i in range(bisect_left(entries, (need_mb, -1)) - 1, -1, -1):
            yield entries[i]

    def hosts_from(self, gpu_nodes: bool, need_mb: int) -> Iterator[tuple[int, int]]:
        entries = self._hosts[gpu_nodes]
        for i in range(bisect_left(entries, (need_mb, -1)), len(entries)):
            yield entries[i]

    def set_slot(self, group: GroupKey, sid: int, free_mb: int) -> None:
        _rekey(self._slots[group], self._slot_key, sid, free_mb)

    def set_host(self, has_gpus: bool, nid: int, free_mb: int) -> None:
        _rekey(self._hosts[has_gpus], self._host_key, nid, free_mb)


def _rekey(entries: list[tuple[int, int]], keys: dict[int, int], item: int, free: int) -> None:
    old = (keys[item], item)
    if old[0] == free:
        return
    del entries[bisect_left(entries, old)]
    keys[item] = free
    insort(entries, (free, item))
