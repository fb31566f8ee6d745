"""The cluster as ``ember status`` shows it (``GET /v1/status``).

The view is built from what the control plane already holds in memory: the nodes' inventories and
assignments (from the control loop's KV mirrors), the replicas' reports and the deployments (from the
registry), and the control loop's last decision per service. Building it does no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from ember.wire import (
    Deployment,
    Device,
    DeviceView,
    NodeInfo,
    NodeReplicaView,
    NodeView,
    ReplicaStatus,
    ScaleBounds,
    ServiceSpec,
    ServiceStatus,
    SlotAssignment,
    StatusView,
)
from ember.wire.jetstream import REPLICA_TTL_S
from ember_platform.control.loop import ControlLoop
from ember_platform.control.service_state import ServiceState
from ember_platform.scheduler import request_from_spec

REPLACED_SHOWN_S = 3600.0  # how long `ember status` tells of a replica that gave way and was replaced

Specs = Mapping[tuple[str, str], ServiceSpec]  # (app, service) -> its spec in the current deployment


def build_status(control: ControlLoop, now: float | None = None, control_plane: str = "") -> StatusView:
    """The status of every live node and deployed service, from the control plane's memory; ``control_plane``:
    the lease holder's id."""
    now = time.time() if now is None else now
    registry = control.registry
    deployments = registry.deployments.items
    fresh_after = now - REPLICA_TTL_S
    replicas = [r for r in registry.replicas.items.values() if r.updated_at > fresh_after]
    specs = {(d.app, s.name): s for d in deployments.values() for s in d.manifest.services}
    assigned = {nid: a.slots for nid, a in control.assignments.items.items()}
    nodes = [node_view(node, assigned.get(nid, []), replicas, specs) for nid, node in control.live_nodes().items()]
    services = [service_status(dep, svc, replicas, control.services.get((dep.app, svc.name)), control.pending,
                               control.failures.get((dep.app, svc.name), ""))
                for _, dep in sorted(deployments.items()) for svc in dep.manifest.services]
    return StatusView(nodes=nodes, services=services, control_plane=control_plane, active=control.active)



def node_view(node: NodeInfo, slots: Iterable[SlotAssignment], replicas: Sequence[ReplicaStatus],
              specs: Specs) -> NodeView:
    """One node: each device with the memory its assigned replicas reserve, and every replica on it."""
    slots = sorted(slots, key=lambda s: s.replica_id)
    states = {r.replica_id: r.state for r in replicas if r.node_id == node.node_id}
    starts = {r.replica_id: r.start for r in replicas if r.node_id == node.node_id}
    on_node = [NodeReplicaView(replica_id=s.replica_id, app=s.app, service=s.service, version=s.version,
                               state=states.pop(s.replica_id, "assigned"), gpu_uuids=list(s.gpu_uuids),
                               start=starts.get(s.replica_id))
               for s in slots]
    unassigned = sorted((r for r in replicas if r.replica_id in states), key=lambda r: r.replica_id)
    on_node += [NodeReplicaView(replica_id=r.replica_id, app=r.app, service=r.service, version=r.version,
                                state=r.state, start=r.start) for r in unassigned]
    devices = [_device_view(d, slots, specs) for d in node.devices]
    return NodeView(node_id=node.node_id, hostname=node.hostname, updated_at=node.updated_at,
                    devices=_with_slices_summed(devices), replicas=on_node, zygotes=list(node.zygotes),
                    warm_starts=dict(node.warm_starts),
                    sandbox=node.sandbox, isolation_notes=list(node.isolation_notes))



def _device_view(device: Device, slots: list[SlotAssignment], specs: Specs) -> DeviceView:
    if device.kind == "gpu":
        mine = [s for s in slots if device.uuid and device.uuid in s.gpu_uuids]
        reserved = sum(s.memory_mb or _memory_mb(specs.get((s.app, s.service))) or device.memory_total_mb
                       for s in mine)  # what it was bound with (an older slot: what its service asks now)
    else:  # the CPU device holds the replicas that use no GPU
        mine, reserved = [s for s in slots if not s.gpu_uuids], 0
    return DeviceView(kind=device.kind, index=device.index, name=device.name, uuid=device.uuid,
                      memory_total_mb=device.memory_total_mb, memory_free_mb=device.memory_free_mb,
                      memory_reserved_mb=reserved, utilization=device.utilization, mig_profile=device.mig_profile,
                      mig_enabled=device.mig_enabled, replicas=[s.replica_id for s in mine], xid=device.xid,
                      fault=device.fault)



def _memory_mb(spec: ServiceSpec | None) -> int:
    """Memory one replica reserves per GPU; 0 takes each GPU whole."""
    return request_from_spec(spec).memory_mb if spec is not None else 0



def _with_slices_summed(devices: list[DeviceView]) -> list[DeviceView]:
    """A GPU in MIG mode is reserved through its slices: show their sum on the GPU too."""
    by_parent: dict[int, int] = {}
    for d in devices:
        if d.mig_profile:
            by_parent[d.index] = by_parent.get(d.index, 0) + d.memory_reserved_mb
    return [msgspec.structs.replace(d, memory_reserved_mb=by_parent.get(d.index, 0)) if d.mig_enabled else d
            for d in devices]



def effective_bounds(dep: Deployment, svc: ServiceSpec) -> ScaleBounds:
    """The bounds the control loop uses: an ``ember scale`` override, else the decorator's."""
    low, high = dep.bounds(svc)
    return ScaleBounds(min_replicas=low, max_replicas=max(high, low, 1))



def _replaced(state: ServiceState | None, now: float | None = None) -> str:
    """When (UTC) and why a replica of the service last gave way and was replaced, if within ``REPLACED_SHOWN_S``."""
    at, why = state.last_replaced if state is not None else (0.0, "")
    if not why or (time.time() if now is None else now) - at > REPLACED_SHOWN_S:
        return ""
    return f"a replica at {time.strftime('%H:%M:%S UTC', time.gmtime(at))}: {why}"


def service_status(dep: Deployment, svc: ServiceSpec, replicas: Iterable[ReplicaStatus], state: ServiceState | None,
                   pending: Mapping[tuple[str, str], int], failure: str = "") -> ServiceStatus:
    """One service: its current version's replicas by state, queued work, and the autoscaler's target."""
    mine = [r for r in replicas if (r.app, r.service) == (dep.app, svc.name)]
    current = [r for r in mine if r.version == dep.version]
    bounds = effective_bounds(dep, svc)
    return ServiceStatus(
        app=dep.app, service=svc.name, version=dep.version, functions=[f.name for f in svc.functions],
        min_replicas=bounds.min_replicas, max_replicas=bounds.max_replicas, scaled=svc.name in dep.scale,
        desired=state.desired if state is not None else 0,
        ready=sum(r.state == "ready" for r in current), starting=sum(r.state == "starting" for r in current),
        crashed=sum(r.state in ("crashed", "failed") for r in current),
        queue_depth=sum(f.queue_depth for r in mine for f in r.functions),
        pending=sum(pending.get((dep.app, f.name), 0) for f in svc.functions),
        unschedulable=state.unschedulable if state is not None else "", quota=state.quota if state is not None else "",
        traffic=dep.serving(), replaced=_replaced(state),
        failure=failure or next((r.message for r in current if r.state == "failed" and r.message), ""))

