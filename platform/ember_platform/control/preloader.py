"""Which zygotes each node keeps: the control loop's side of the pure policy in ``scheduler._preload``.

Every few seconds (and at once when a new version is deployed) it turns what the control loop knows into
``PreloadCandidate``s: services with ``@ember.setup(snap=True)`` methods, the nodes where each version
runs in the current plan, the nodes placement would pick for its next replicas, its recent call rate and
its ``min_replicas``, and each zygote's size as its node measured it. ``plan_preload`` then fills each
node's budget: a share of its host memory (``EMBER_ZYGOTE_MEMORY_FRACTION``, 25 % by default), at most what the
replicas placed there left unreserved (``zygote_budget_mb``). Each zygote assigned is told how many children to
keep forked ahead of their requests (``scheduler.preload.spares``): the starts placement would make on its node of
the function's next replicas (``starts_ahead`` of them).

A node whose sandboxes bind their GPUs' device nodes (``NodeInfo.gpu_forks`` false) forks a GPU replica only from a
zygote whose sandbox holds that replica's GPUs: there a GPU service's zygote is told which (``ZygoteAssignment.gpus``,
``device_sets``): those of a replica still starting there, else those of the next starts there (it stays on its GPUs
while one of them would use them), else those of one running there (its restart). A zygote never holds a GPU that
another app's replica is placed on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from ember.wire import Deployment, NodeInfo, SlotAssignment, VolumeMount, ZygoteAssignment
from ember.wire.images import ImageSpec
from ember_platform.control.plan import replica_request
from ember_platform.scheduler import Snapshot
from ember_platform.scheduler.decision import Binding
from ember_platform.scheduler.preload import (
    PreloadCandidate,
    ZygoteKey,
    next_bindings,
    plan_preload,
    spares,
    starts_ahead,
)
from ember_platform.scheduler.request import request_from_spec

PRELOAD_EVERY_S = 2.0
LIKELY_COUNT = 2  # how many next replicas' nodes count as likely
DEFAULT_ZYGOTE_MB = 1024  # a zygote's size before any node measured one of the service
UNKNOWN_NODE_MEMORY_MB = 8192  # the budget's base for a node that did not report its memory


def memory_fraction() -> float:
    try:
        return min(max(float(os.environ.get("EMBER_ZYGOTE_MEMORY_FRACTION", "0.25")), 0.0), 1.0)
    except ValueError:
        return 0.25


@dataclass
class Preloader:
    demand: Callable[[str, str], float]  # (app, service) -> calls per second, as the autoscaler measured it
    _plan: dict[str, list[ZygoteAssignment]] = field(default_factory=dict)
    _at: float = 0.0
    _versions: frozenset[tuple[str, int, str]] = frozenset()  # each app's version and bundle, as last computed

    def zygotes(self, plan: Mapping[str, list[SlotAssignment]], nodes: Mapping[str, NodeInfo],
                deployments: Mapping[str, Deployment], snapshot: Callable[[], Snapshot],
                now: float | None = None, reported: Container[str] = frozenset()) -> dict[str, list[ZygoteAssignment]]:
        """Each live node's zygotes; recomputed every ``PRELOAD_EVERY_S`` or when a version is deployed.
        ``snapshot()`` is the cluster as placement sees it (built only when needed); ``reported``: the replicas that
        reported their state (one placed that did not yet is starting: see ``device_sets``)."""
        now = time.time() if now is None else now
        # a push changes them, and so does an app deleted and pushed again (its version 1 again, another bundle)
        versions = frozenset((d.app, d.version, d.bundle_sha256) for d in deployments.values())
        if now - self._at >= PRELOAD_EVERY_S or versions != self._versions or set(self._plan) != set(nodes):
            self._plan = self._compute(plan, nodes, deployments, snapshot, reported)
            self._at, self._versions = now, versions
        return self._plan

    def _compute(self, plan: Mapping[str, list[SlotAssignment]], nodes: Mapping[str, NodeInfo],
                 deployments: Mapping[str, Deployment],
                 snapshot_of: Callable[[], Snapshot], reported: Container[str]) -> dict[str, list[ZygoteAssignment]]:
        running: dict[ZygoteKey, set[str]] = {}
        planned: dict[ZygoteKey, int] = {}
        for nid, slots in plan.items():
            for s in slots:
                key = ZygoteKey(s.app, s.service, s.version)
                running.setdefault(key, set()).add(nid)
                planned[key] = planned.get(key, 0) + 1
        measured = {ZygoteKey(z.app, z.service, z.version): z.rss_mb
                    for n in nodes.values() for z in n.zygotes if z.rss_mb > 0}
        snapshot: Snapshot | None = None
        starts: dict[ZygoteKey, list[Binding]] = {}  # where the replicas each current version may add next would go
        candidates: list[PreloadCandidate] = []
        assignments: dict[ZygoteKey, ZygoteAssignment] = {}
        no_gpu_forks = frozenset(nid for nid, n in nodes.items() if not n.gpu_forks)
        gpu_zygotes = frozenset(nid for nid in no_gpu_forks if nodes[nid].gpu_zygotes)
        faulty = frozenset((nid, d.uuid) for nid in gpu_zygotes for d in nodes[nid].devices if d.fault)
        gpus_at: dict[ZygoteKey, dict[str, tuple[str, ...]]] = {}  # the GPUs of each zygote that holds some
        held_gpus: dict[ZygoteKey, dict[str, tuple[str, ...]]] = {}  # and as the last plan had them
        for nid, zygotes in self._plan.items():
            for z in zygotes:
                if z.gpus:
                    held_gpus.setdefault(ZygoteKey(z.app, z.service, z.version), {})[nid] = tuple(z.gpus)
        for dep in deployments.values():
            for svc in dep.manifest.services:
                if not svc.snap:
                    continue
                # A node whose sandboxes bind their GPUs' device nodes forks a GPU replica only from a zygote whose
                # sandbox holds its GPUs (ember_runtime.agent.slots.unforkable): one whose agent builds such
                # zygotes is told which GPUs; an agent that cannot keeps no zygote of a GPU service.
                gpu = not request_from_spec(svc).cpu_only
                unforkable = no_gpu_forks - gpu_zygotes if gpu else frozenset()
                versions = {k.version for k in running if k.app == dep.app and k.service == svc.name}
                for version in sorted(versions | {dep.version}):
                    key = ZygoteKey(dep.app, svc.name, version)
                    current = version == dep.version
                    likely: tuple[str, ...] = ()
                    bindings: list[Binding] = []
                    demand, low, full = 0.0, 0, True  # an old version's: it only restarts where it still runs
                    if current:
                        low, high = dep.bounds(svc)
                        demand = self.demand(dep.app, svc.name)
                        ahead = starts_ahead(demand, low, high, planned.get(key, 0))
                        full = planned.get(key, 0) >= high
                        if snapshot is None:
                            snapshot = snapshot_of()
                        request = replica_request(dep, svc, f"preload-{dep.app}-{svc.name}")
                        bindings = next_bindings(snapshot, request, max(LIKELY_COUNT, ahead))
                        likely = tuple(n for n in dict.fromkeys(b.node_id for b in bindings[:LIKELY_COUNT])
                                       if n not in unforkable)
                        starts[key] = bindings[:ahead]
                    near = gpu_zygotes & {*running.get(key, ()), *(b.node_id for b in bindings)} if gpu else set()
                    # at its maximum, its next start is a restart, or the replacement of a replica on a failed GPU
                    expected = bindings if not gpu or not full or (faulty and _on(key, plan, faulty)) else []
                    sets = device_sets(key, expected, plan, near, reported, held_gpus.get(key), faulty)
                    gpus_at[key] = {nid: gpus for nid, gpus in sets.items() if gpus}
                    unplaced = unforkable | {nid for nid, gpus in sets.items() if not gpus}
                    candidates.append(PreloadCandidate(
                        key=key, function=f"{dep.app}.{svc.name}", size_mb=measured.get(key, _estimate(key, measured)),
                        running_nodes=frozenset(running.get(key, ())) - unplaced,
                        likely_nodes=tuple(n for n in likely if n not in unplaced),
                        demand=demand, min_replicas=low, current=current))
                    assignments[key] = ZygoteAssignment(app=dep.app, service=svc.name, version=version,
                                                        bundle_sha256=_bundle_of(dep, version, plan),
                                                        module=dep.manifest.module,
                                                        volumes=_volumes_of(dep, svc.name, version, plan),
                                                        image=_image_of(dep, svc.name, version, plan),
                                                        block_network=_blocked(dep, svc.name, version, plan),
                                                        host_memory_mb=_memory_of(dep, svc.name, version, plan))
        held = {nid: frozenset(ZygoteKey(z.app, z.service, z.version) for z in self._plan.get(nid, ()))
                for nid in nodes}
        budgets = {nid: zygote_budget_mb(n, plan.get(nid, ())) for nid, n in nodes.items()}
        chosen = plan_preload([c for c in candidates if assignments[c.key].bundle_sha256], budgets, held)
        return {nid: [_on_node(assignments[k], nid, starts.get(k, []), gpus_at.get(k, {}).get(nid, ()),
                               _starting(k, plan.get(nid, ()), reported))
                      for k in sorted(keys)] for nid, keys in chosen.items()}


def _on_node(assignment: ZygoteAssignment, node_id: str, starts: list[Binding], gpus: tuple[str, ...],
             starting: Sequence[SlotAssignment] = ()) -> ZygoteAssignment:
    """``assignment`` as ``node_id`` holds it: its GPUs there, and a spare for each start expected there (of those
    GPUs, for a zygote that holds some: a replica on others does not fork from it): the replicas placed there and
    not started yet (``starting``: their spares are theirs until their agent asks for them), then the next ones."""
    expected = [node_id for s in starting if not gpus or tuple(s.gpu_uuids) == gpus]
    expected += [b.node_id for b in starts if not gpus or b.gpu_uuids == gpus]
    return msgspec.structs.replace(assignment, spares=spares(expected, node_id), gpus=list(gpus))


def _starting(key: ZygoteKey, slots: Iterable[SlotAssignment], reported: Container[str]) -> list[SlotAssignment]:
    """The replicas of ``key`` among ``slots`` that did not report their state yet (placed, not started)."""
    return [s for s in slots if ZygoteKey(s.app, s.service, s.version) == key and s.replica_id not in reported]


def _on(key: ZygoteKey, plan: Mapping[str, list[SlotAssignment]], gpus: Container[tuple[str, str]]) -> bool:
    """Whether a replica of ``key`` is placed on one of ``gpus`` (node and GPU)."""
    return any((nid, uuid) in gpus for nid, slots in plan.items() for s in slots
               if ZygoteKey(s.app, s.service, s.version) == key for uuid in s.gpu_uuids)


def device_sets(key: ZygoteKey, bindings: Sequence[Binding], plan: Mapping[str, list[SlotAssignment]],
                nodes: Iterable[str], reported: Container[str] = frozenset(),
                held: Mapping[str, tuple[str, ...]] | None = None,
                faulty: Container[tuple[str, str]] = frozenset()) -> dict[str, tuple[str, ...]]:
    """For each of ``nodes`` (those whose zygotes of a GPU service hold its GPUs) where ``key`` may start next or
    runs: the GPUs its zygote there holds. Those of a replica of ``key`` placed there that has not ``reported`` yet
    (starting: a new version's first replicas wait for their zygote); else those it ``held`` there by the last plan
    while one of the next starts there (``bindings``), or a restart where none is expected, would use them (a move is
    a new build: replicas that share GPUs by memory are spread over them, and would move it at each start); else
    those of the first of ``bindings`` on that node, else those of a replica of ``key`` running there (its
    restart); a replica on a GPU out of service (``faulty``: node and GPU) counts for neither, it is being replaced.
    None (an empty tuple: no zygote there) where another app's replica is placed on one of them: a zygote runs its
    app's code, and never on a GPU another app's replica is given."""
    sets: dict[str, tuple[str, ...]] = {}
    for nid in nodes:
        mine = [s for s in plan.get(nid, ()) if ZygoteKey(s.app, s.service, s.version) == key and s.gpu_uuids
                and not any((nid, uuid) in faulty for uuid in s.gpu_uuids)]
        starts = [b.gpu_uuids for b in bindings if b.node_id == nid] or [tuple(s.gpu_uuids) for s in mine]
        chosen = next((tuple(s.gpu_uuids) for s in mine if s.replica_id not in reported), None)
        if chosen is None and (kept := (held or {}).get(nid)) in starts:
            chosen = kept
        if chosen is None:
            chosen = next(iter(starts), None)
        if chosen is None:  # it runs there only on a GPU being replaced: nothing to hold
            sets[nid] = ()
            continue
        taken = {uuid for s in plan.get(nid, ()) if s.app != key.app for uuid in s.gpu_uuids}
        sets[nid] = () if taken & set(chosen) else chosen
    return sets


def zygote_budget_mb(node: NodeInfo, slots: Iterable[SlotAssignment]) -> int:
    """What a node's zygotes may hold: its share of the node's host memory (``memory_fraction``), and never what
    the replicas placed there reserved (``memory=``): a replica's reservation is its own, so zygotes give way to
    it (the next plan drops those that no longer fit) rather than push the node past its memory."""
    total = node.memory_mb or UNKNOWN_NODE_MEMORY_MB
    reserved = sum(s.host_memory_mb for s in slots)
    return max(0, min(int(total * memory_fraction()), total - reserved))


def _estimate(key: ZygoteKey, measured: Mapping[ZygoteKey, int]) -> int:
    """Another version's measured size, else the default."""
    sizes = [mb for k, mb in measured.items() if (k.app, k.service) == (key.app, key.service)]
    return max(sizes) if sizes else DEFAULT_ZYGOTE_MB


def _volumes_of(dep: Deployment, service: str, version: int,
                plan: Mapping[str, list[SlotAssignment]]) -> list[VolumeMount]:
    """The volumes a version's zygote mounts: the deployment's for its version, else its running slots'."""
    if version == dep.version:
        return next((s.volumes for s in dep.manifest.services if s.name == service), [])
    return next((s.volumes for slots in plan.values() for s in slots
                 if s.app == dep.app and s.service == service and s.version == version), [])


def _image_of(dep: Deployment, service: str, version: int,
              plan: Mapping[str, list[SlotAssignment]]) -> ImageSpec | None:
    """The image a version's zygote runs in: the deployment's for its version, else its running slots'."""
    if version == dep.version:
        return next((s.image for s in dep.manifest.services if s.name == service), None)
    return next((s.image for slots in plan.values() for s in slots
                 if s.app == dep.app and s.service == service and s.version == version), None)


def _blocked(dep: Deployment, service: str, version: int, plan: Mapping[str, list[SlotAssignment]]) -> bool:
    """Whether a version's zygote has no way out of its network (``block_network``): as its image, above."""
    if version == dep.version:
        return next((s.block_network for s in dep.manifest.services if s.name == service), False)
    return next((s.block_network for slots in plan.values() for s in slots
                 if s.app == dep.app and s.service == service and s.version == version), False)


def _memory_of(dep: Deployment, service: str, version: int, plan: Mapping[str, list[SlotAssignment]]) -> int:
    """The host memory a version's replicas are bounded by (its service's ``memory=``), for its zygote too."""
    if version == dep.version:
        return next((s.memory_mb for s in dep.manifest.services if s.name == service), 0)
    return next((s.host_memory_mb for slots in plan.values() for s in slots
                 if s.app == dep.app and s.service == service and s.version == version), 0)


def _bundle_of(dep: Deployment, version: int, plan: Mapping[str, list[SlotAssignment]]) -> str:
    if version == dep.version:
        return dep.bundle_sha256
    return next((s.bundle_sha256 for slots in plan.values() for s in slots
                 if s.app == dep.app and s.version == version and s.bundle_sha256), "")
