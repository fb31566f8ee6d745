"""The control loop's plan (each live node's slots) as placement sees it."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping

import msgspec

from ember.wire import Deployment, NodeInfo, ReplicaStatus, ServiceSpec, SlotAssignment
from ember_platform.scheduler import (
    Binding,
    Cluster,
    PlacementRequest,
    Reservation,
    Snapshot,
    build_snapshot,
    request_from_spec,
)

Plan = dict[str, list[SlotAssignment]]  # node id -> its slots


def cluster_snapshot(plan: Plan, nodes: dict[str, NodeInfo], deployments: dict[str, Deployment]) -> Snapshot:
    """The live nodes and what the plan's replicas hold on them: each replica what it was bound with (its slot's
    memory), not what the current version asks (a replica of the version before, or the warm one, held a whole GPU
    that read as the new version's 20 GB: another was placed on it). A slot written before slots kept their memory
    holds what its own version asks. Only the apps that have replicas in the plan are looked at: the cost follows
    what runs, not what is deployed."""
    own: dict[tuple[str, int, str], ServiceSpec] = {}  # what each version's services asked
    for app, version in {(s.app, s.version) for slots in plan.values() for s in slots}:
        dep = deployments.get(app)
        if dep is not None and (release := dep.release(version)) is not None:
            own.update(((app, version, svc.name), svc) for svc in release.manifest.services)
    reservations = [_held(nid, s, own.get((s.app, s.version, s.service))) for nid, slots in plan.items() for s in slots]
    return build_snapshot(Cluster.from_nodes(nodes.values()), reservations)


def _held(node_id: str, slot: SlotAssignment, spec: ServiceSpec | None) -> Reservation:
    """What ``slot``'s replica holds: GPU memory per GPU (0: each whole) and host memory."""
    return Reservation(replica_id=slot.replica_id, function=f"{slot.app}.{slot.service}", node_id=node_id,
                       gpu_uuids=tuple(slot.gpu_uuids),
                       memory_mb=slot.memory_mb or (request_from_spec(spec).memory_mb if spec is not None else 0),
                       host_memory_mb=slot.host_memory_mb or (spec.memory_mb if spec is not None else 0))


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


_KEPT_FIRST = {"ready": 2, "starting": 1}  # a scale-down keeps what serves, then what is about to; the rest go first


def surplus(slots: Iterable[SlotAssignment], replicas: Mapping[str, ReplicaStatus], n: int,
            keep: Collection[str] = ()) -> set[str]:
    """The ``n`` replicas of ``slots`` a scale-down stops (none of ``keep``): those that serve nothing first (failed,
    crashed, not reported), then those still starting, then ready ones; the highest index first within each. Before,
    starting replicas were never stopped and the rest by index alone: a service going from two to one stopped its
    ready replica and kept the one still loading (nothing served until its setup ended), or kept a failed one."""
    def order(slot: SlotAssignment) -> tuple[int, int]:
        status = replicas.get(slot.replica_id)
        return _KEPT_FIRST.get(status.state, 0) if status is not None else 0, -slot.index

    return {s.replica_id for s in sorted((s for s in slots if s.replica_id not in keep), key=order)[:max(n, 0)]}


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


def new_replica_id(app: str, service: str, version: int, index: int) -> str:
    """A new replica's id: its app, service, version and index, and a random part."""
    return f"{app}-{service}-v{version}-{index}-{uuid.uuid4().hex[:6]}"


def slot_request(dep: Deployment, svc: ServiceSpec, index: int) -> tuple[PlacementRequest, SlotAssignment]:
    """What placing replica ``index`` of ``dep``'s version of ``svc`` asks, and the slot it fills."""
    return (replica_request(dep, svc, new_replica_id(dep.app, svc.name, dep.version, index)),
            SlotAssignment(replica_id="", app=dep.app, service=svc.name, version=dep.version, index=index,
                           bundle_sha256=dep.bundle_sha256, module=dep.manifest.module,
                           startup_timeout_s=svc.startup_timeout_s, secrets=bool(svc.secrets), volumes=svc.volumes,
                           image=svc.image, block_network=svc.block_network))


def assign(plan: Plan, slot: SlotAssignment, binding: Binding) -> None:
    """Adds ``slot`` to the plan where ``binding`` puts it."""
    plan.setdefault(binding.node_id, []).append(msgspec.structs.replace(
        slot, gpu_uuids=list(binding.gpu_uuids), gpu_indices=list(binding.gpu_indices), numa_node=binding.numa_node,
        memory_mb=binding.memory_mb, host_memory_mb=binding.host_memory_mb))
