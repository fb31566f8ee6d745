"""The control loop's plan (each live node's slots) as placement sees it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ember.wire import Deployment, NodeInfo, ReplicaStatus, ServiceSpec, SlotAssignment
from ember_platform.scheduler import Cluster, PlacementRequest, Reservation, Snapshot, build_snapshot, request_from_spec

Plan = dict[str, list[SlotAssignment]]  # node id -> its slots


def cluster_snapshot(plan: Plan, nodes: dict[str, NodeInfo], deployments: dict[str, Deployment]) -> Snapshot:
    """The live nodes and what the plan's replicas hold on them. Only the apps that have replicas in the plan are
    looked at: the cost follows what runs, not what is deployed."""
    held = [deployments[app] for app in sorted({s.app for slots in plan.values() for s in slots})
            if app in deployments]
    specs = {(d.app, s.name): s for d in held for s in d.manifest.services}
    for d in held:  # the replicas of the other versions that still run hold what theirs ask
        for version in (d.running() | {d.warm}) - {d.version, 0}:  # and the warm one's
            for s in (d.release(version) or d).manifest.services:
                specs.setdefault((d.app, s.name), s)
    reservations = [Reservation(replica_id=s.replica_id, function=f"{s.app}.{s.service}", node_id=nid,
                                gpu_uuids=tuple(s.gpu_uuids),
                                memory_mb=request_from_spec(specs[(s.app, s.service)]).memory_mb,
                                host_memory_mb=specs[(s.app, s.service)].memory_mb)
                    for nid, slots in plan.items() for s in slots if (s.app, s.service) in specs]
    return build_snapshot(Cluster.from_nodes(nodes.values()), reservations)


def replica_request(dep: Deployment, svc: ServiceSpec, replica_id: str) -> PlacementRequest:
    """What one replica of the current version of ``svc`` asks of placement (the control loop's placements and the
    preloader's dry runs of them alike)."""
    return PlacementRequest(replica_id=replica_id, function=f"{dep.app}.{svc.name}", gpu=request_from_spec(svc),
                            cpu_millis=0, host_memory_mb=svc.memory_mb, bundle=dep.bundle_sha256,
                            volumes=tuple(m.key for m in svc.volumes),
                            environment=svc.image.sha256 if svc.image else "")


def on_faulty_gpus(plan: Plan, nodes: Mapping[str, NodeInfo]) -> dict[str, str]:
    """Replica id -> why, for each replica of the plan on a GPU its node put out of service (``Device.fault``)."""
    found: dict[str, str] = {}
    for nid, slots in plan.items():
        info = nodes.get(nid)
        faults = {d.uuid: f"GPU {d.index} ({d.uuid}) of node {nid} reported {d.fault}"
                  for d in (info.devices if info is not None else ()) if d.fault}
        for s in slots if faults else ():
            if why := next((faults[u] for u in s.gpu_uuids if u in faults), ""):
                found[s.replica_id] = why
    return found


def to_replace(slots: Iterable[SlotAssignment], replicas: Mapping[str, ReplicaStatus],
            faulty: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Replica id -> (why, what it said), for each of ``slots`` to replace: one that gave way on its own (stopping:
    stuck past its timeout, its health check failed, its node draining; why from its ``gave_way``) or that runs on
    a GPU out of service (why: ``gpu``)."""
    found = {s.replica_id: ("gpu", faulty[s.replica_id]) for s in slots if s.replica_id in faulty}
    for s in slots:
        status = replicas.get(s.replica_id)
        if status is not None and status.state == "stopping":
            found[s.replica_id] = (status.gave_way or "other", status.message)
    return found


def of_another_push(plan: Plan, deployments: Mapping[str, Deployment]) -> list[SlotAssignment]:
    """The slots whose bundle is not their version's: their app was deleted and pushed again, under the same name
    and version number, before the control loop saw it gone. Their replicas run the old app's code."""
    def stale(s: SlotAssignment) -> bool:
        dep = deployments.get(s.app)
        if dep is None or not s.bundle_sha256:
            return False
        kept = dep if s.version == dep.version else dep.release(s.version)
        return kept is not None and kept.bundle_sha256 != s.bundle_sha256

    return [s for slots in plan.values() for s in slots if stale(s)]
