"""Quotas on placement: how many replicas each service may have so that every apps quota's ``max_replicas`` and
``max_gpu_memory_mb`` hold, and what a quota's apps hold now. Pure functions; the control loop does the I/O.

A quota counts every service of the apps it matches, together. Each service gets first its minimum (its
``min_replicas``, or fewer when the autoscaler wants fewer), in the order given, then what it wants beyond it, in
the same order, as far as every quota that covers it allows: a quota wins over ``min_replicas``, and the service
says why it has fewer (``Cap.reason``). A replica's GPU memory is what it reserves on each of its GPUs times their
count; a replica that takes whole GPUs counts each as its total memory (before it is placed: the largest GPU of a
type it accepts).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ember._resources import GpuRequest
from ember.wire import Device, SlotAssignment
from ember.wire.quotas import Quota
from ember_platform.quotas.rules import covers_app, limits_placement

_MIG_GB = re.compile(r"\.([0-9]+)gb$")


@dataclass(frozen=True)
class Want:
    """What one service asks for this tick: at least ``minimum`` replicas, ``wanted`` in all, ``gpu_mb`` each."""

    app: str
    service: str
    minimum: int
    wanted: int
    gpu_mb: int = 0


@dataclass(frozen=True)
class Cap:
    allowed: int
    reason: str = ""  # why ``allowed`` is below what the service wanted; "" when it is not


def replica_gpu_mb(gpu: GpuRequest, devices: Iterable[Device]) -> int:
    """The GPU memory one replica of ``gpu`` counts against a quota."""
    if gpu.count == 0:
        return 0
    if gpu.memory_mb > 0:
        return gpu.count * gpu.memory_mb
    if gpu.mig_profile:
        found = _MIG_GB.search(gpu.mig_profile)
        return int(found[1]) * 1024 if found else 0
    totals = [d.memory_total_mb for d in devices if d.kind == "gpu" and not d.mig_profile
              and (not gpu.types or any(t.upper() in d.name.upper() for t in gpu.types))]
    return gpu.count * max(totals, default=0)


def slot_gpu_mb(slot: SlotAssignment, gpu_total_mb: Mapping[str, int]) -> int:
    """The GPU memory an assigned replica holds: its reservation on each GPU, or each GPU's (or slice's) total."""
    if slot.memory_mb > 0:
        return slot.memory_mb * len(slot.gpu_uuids)
    return sum(gpu_total_mb.get(uuid, 0) for uuid in slot.gpu_uuids)


def usage(quota: Quota, slots: Iterable[SlotAssignment], gpu_total_mb: Mapping[str, int]) -> tuple[int, int]:
    """(replicas, GPU memory in MB) that the apps of ``quota`` hold among ``slots``."""
    mine = [s for s in slots if covers_app(quota, s.app)]
    return len(mine), sum(slot_gpu_mb(s, gpu_total_mb) for s in mine)


def cap(quotas: Iterable[Quota], wants: Sequence[Want]) -> dict[tuple[str, str], Cap]:
    """How many replicas each service of ``wants`` may have under ``quotas``, keyed by (app, service)."""
    binding = [q for q in quotas if limits_placement(q)]
    left = {q.name: [q.max_replicas, q.max_gpu_memory_mb] for q in binding}
    over = {(w.app, w.service): [q for q in binding if covers_app(q, w.app)] for w in wants}
    granted = {(w.app, w.service): 0 for w in wants}
    held_by: dict[tuple[str, str], Quota] = {}

    def grant(w: Want, up_to: int) -> None:
        key = (w.app, w.service)
        n = max(0, up_to - granted[key])
        for q in over[key]:
            replicas, memory = left[q.name]
            room = n if replicas is None else min(n, replicas)
            if memory is not None and w.gpu_mb > 0:
                room = min(room, memory // w.gpu_mb)
            if room < n:
                n, held_by[key] = room, q
        for q in over[key]:
            if left[q.name][0] is not None:
                left[q.name][0] -= n  # type: ignore[operator]
            if left[q.name][1] is not None:
                left[q.name][1] -= n * w.gpu_mb  # type: ignore[operator]
        granted[key] += n

    for w in wants:
        grant(w, min(w.minimum, w.wanted))
    for w in wants:
        grant(w, w.wanted)
    return {(w.app, w.service): Cap(granted[(w.app, w.service)], _reason(w, granted[(w.app, w.service)],
                                                                         held_by.get((w.app, w.service))))
            for w in wants}


def _reason(w: Want, allowed: int, quota: Quota | None) -> str:
    if allowed >= w.wanted or quota is None:
        return ""
    limits = [f"max_replicas {quota.max_replicas}"] if quota.max_replicas is not None else []
    limits += [f"max_gpu_memory_mb {quota.max_gpu_memory_mb}"] if quota.max_gpu_memory_mb is not None else []
    text = (f"quota {quota.name!r} ({', '.join(limits)} for apps {quota.apps!r}) allows {allowed} of the "
            f"{w.wanted} replicas wanted")
    if allowed < w.minimum:
        text += f": the quota wins over min_replicas {w.minimum}"
    return text
