"""The control loop: keeps every deployed service at its desired replica count, placed on live nodes.

Each tick it reads the nodes' inventories, the replicas' reports and the gateway's load, asks the pure
policies (``scheduler.desired_replicas``, ``scheduler.place``) what to run where, and writes each node's
``NodeAssignment``; node agents run what is assigned to them. A node that stops reporting loses its
assignment and its replicas are placed elsewhere; a new version's replicas are placed beside the old
ones, which are removed once the new ones are ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ember import _subjects as subjects
from ember._nats import NODE_LOST_S, KVMirror
from ember._wire import (
    Deployment,
    NodeAssignment,
    NodeInfo,
    ReplicaStatus,
    ServiceSpec,
    SlotAssignment,
    ZygoteAssignment,
    assignment_decoder,
    encoder,
    node_decoder,
)
from ember_platform._preloading import Preloader
from ember_platform._registry import Registry
from ember_platform.scheduler import (
    AutoscaleConfig,
    AutoscaleState,
    Binding,
    Cluster,
    PlacementRequest,
    Reservation,
    Signals,
    build_snapshot,
    desired_replicas,
    initial_state,
    place,
    request_from_spec,
)

log = logging.getLogger("ember.control")
TICK_S = 0.5
Plan = dict[str, list[SlotAssignment]]  # node id -> its slots


@dataclass
class ServiceState:
    autoscale: AutoscaleState
    calls_seen: int = 0
    at: float = 0.0
    unschedulable: str = ""  # why the last placement failed, for `ember status`
    desired: int = 0


@dataclass
class ControlLoop:
    registry: Registry
    stores: dict[str, Any]
    gateway_load: Callable[[str, str], int]  # (app, service) -> calls in flight at the gateway
    js: Any
    services: dict[tuple[str, str], ServiceState] = field(default_factory=dict)
    pending: dict[tuple[str, str], int] = field(default_factory=dict)  # (app, function) -> durable backlog

    async def start(self) -> None:
        self.preloader = Preloader(self.registry)
        self.nodes: KVMirror[NodeInfo] = KVMirror(self.stores["nodes"], node_decoder.decode)
        self.assignments: KVMirror[NodeAssignment] = KVMirror(self.stores["assignments"], assignment_decoder.decode)
        await self.nodes.start()
        await self.assignments.start()
        self._task = asyncio.create_task(self._run(), name="control-loop")

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.nodes.stop()
        await self.assignments.stop()

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("control loop tick failed")
            await asyncio.sleep(TICK_S)

    def live_nodes(self) -> dict[str, NodeInfo]:
        fresh_after = time.time() - NODE_LOST_S
        return {nid: n for nid, n in sorted(self.nodes.items.items()) if n.updated_at > fresh_after}

    async def tick(self) -> None:
        now = time.time()
        nodes = self.live_nodes()
        plan: Plan = {nid: list(a.slots) for nid, a in self.assignments.items.items() if nid in nodes}
        for nid in nodes:
            plan.setdefault(nid, [])
        deployments = self.registry.deployments.items
        await self._refresh_pending(deployments)
        _drop(plan, lambda s: s.app not in deployments)
        requests: list[tuple[PlacementRequest, SlotAssignment]] = []
        for dep in deployments.values():
            for svc in dep.manifest.services:
                requests += await self._reconcile_service(plan, dep, svc, now)
        if requests:
            self._place(plan, nodes, requests, deployments)
        await self._write(plan, self.preloader.zygotes(plan, nodes, deployments, now), now)

    async def _reconcile_service(self, plan: Plan, dep: Deployment, svc: ServiceSpec,
                                 now: float) -> list[tuple[PlacementRequest, SlotAssignment]]:
        replicas = {r.replica_id: r for r in self.registry.live_replicas(dep.app, svc.name)}
        state = self.services.setdefault((dep.app, svc.name), ServiceState(autoscale=initial_state(_config(dep, svc))))
        target = self._target(state, dep, svc, replicas, now)
        current = _slots(plan, dep.app, svc.name, lambda v: v == dep.version)
        ready_now = sum(replicas.get(s.replica_id, _NONE).state == "ready" for s in current)
        if ready_now >= target or target == 0:  # the new version serves: old versions go
            _drop(plan, lambda s: s.app == dep.app and s.service == svc.name and s.version != dep.version)
        if len(current) > target:
            removable = [s for s in sorted(current, key=lambda s: -s.index)
                         if replicas.get(s.replica_id, _NONE).state != "starting"]
            doomed = {s.replica_id for s in removable[:len(current) - target]}
            _drop(plan, lambda s: s.replica_id in doomed)
        used = {s.index for s in current}
        free = (i for i in range(10_000) if i not in used)
        missing = [next(free) for _ in range(target - len(current))]
        gpu = request_from_spec(svc)
        return [(PlacementRequest(replica_id=f"{dep.app}-{svc.name}-v{dep.version}-{i}-{uuid.uuid4().hex[:6]}",
                                  function=f"{dep.app}.{svc.name}", gpu=gpu, cpu_millis=0, host_memory_mb=0,
                                  bundle=dep.bundle_sha256),
                 SlotAssignment(replica_id="", app=dep.app, service=svc.name, version=dep.version, index=i,
                                bundle_sha256=dep.bundle_sha256, module=dep.manifest.module))
                for i in missing]

    def _target(self, state: ServiceState, dep: Deployment, svc: ServiceSpec,
                replicas: dict[str, ReplicaStatus], now: float) -> int:
        mine = [r for r in replicas.values() if r.version == dep.version]
        calls = sum(r.calls for r in mine)
        rate = max(calls - state.calls_seen, 0) / (now - state.at) if state.at else 0.0
        state.calls_seen, state.at = calls, now
        signals = Signals(
            now=now, ready=sum(r.state == "ready" for r in mine), starting=sum(r.state == "starting" for r in mine),
            queue_depth=sum(f.queue_depth for r in mine for f in r.functions),
            durable_pending=sum(self.pending.get((dep.app, f.name), 0) for f in svc.functions),
            in_flight=self.gateway_load(dep.app, svc.name), arrival_rate=rate)
        count, state.autoscale = desired_replicas(signals, _config(dep, svc), state.autoscale)
        state.desired = count
        return count

    async def _refresh_pending(self, deployments: dict[str, Deployment]) -> None:
        """Calls waiting in each function's durable queue (scale-up signal for queued work)."""
        for dep in deployments.values():
            for svc in dep.manifest.services:
                for fn in svc.functions:
                    try:
                        name = subjects.calls_consumer(dep.app, fn.name)
                        info = await self.js.consumer_info(subjects.CALLS_STREAM, name)
                    except Exception:
                        continue
                    self.pending[(dep.app, fn.name)] = (info.num_pending or 0) + (info.num_ack_pending or 0)

    def _place(self, plan: Plan, nodes: dict[str, NodeInfo], requests: list[tuple[PlacementRequest, SlotAssignment]],
               deployments: dict[str, Deployment]) -> None:
        specs = {(d.app, s.name): s for d in deployments.values() for s in d.manifest.services}
        reservations = [Reservation(replica_id=s.replica_id, function=f"{s.app}.{s.service}", node_id=nid,
                                    gpu_uuids=tuple(s.gpu_uuids),
                                    memory_mb=request_from_spec(specs[(s.app, s.service)]).memory_mb)
                        for nid, slots in plan.items() for s in slots if (s.app, s.service) in specs]
        snapshot = build_snapshot(Cluster.from_nodes(nodes.values()), reservations)
        decisions = place(snapshot, [request for request, _ in requests])
        for (request, slot), decision in zip(requests, decisions, strict=True):
            state = self.services[(slot.app, slot.service)]
            if not isinstance(decision, Binding):
                if state.unschedulable != decision.reason:
                    log.warning("%s.%s: cannot place a replica: %s", slot.app, slot.service, decision.reason)
                state.unschedulable = decision.reason
                continue
            state.unschedulable = ""
            _drop(plan, _in(frozenset(decision.preempts)))
            plan.setdefault(decision.node_id, []).append(SlotAssignment(
                replica_id=request.replica_id, app=slot.app, service=slot.service, version=slot.version,
                index=slot.index, gpu_uuids=list(decision.gpu_uuids), gpu_indices=list(decision.gpu_indices),
                numa_node=decision.numa_node, bundle_sha256=slot.bundle_sha256, module=slot.module,
                memory_mb=decision.memory_mb))

    async def _write(self, plan: Plan, zygotes: dict[str, list[ZygoteAssignment]], now: float) -> None:
        for nid in set(plan) | set(self.assignments.items):
            slots = sorted(plan.get(nid, []), key=lambda s: s.replica_id)
            preload = zygotes.get(nid, [])
            old = self.assignments.items.get(nid)
            if old is not None and old.slots == slots and old.zygotes == preload:
                continue
            if nid not in plan:  # a node that is gone: forget it
                with contextlib.suppress(Exception):
                    await self.stores["assignments"].delete(nid)
                    self.assignments.record(nid, None, 0)
                continue
            assignment = NodeAssignment(node_id=nid, slots=slots, updated_at=now, zygotes=preload)
            revision = await self.stores["assignments"].put(nid, encoder.encode(assignment))
            self.assignments.record(nid, assignment, revision)


class _Absent:
    state = "absent"


_NONE: Any = _Absent()


def _config(dep: Deployment, svc: ServiceSpec) -> AutoscaleConfig:
    low, high = dep.bounds(svc)
    return AutoscaleConfig(min_replicas=low, max_replicas=max(high, low, 1), scaledown_window_s=svc.scaledown_window_s,
                           buffer_replicas=svc.buffer_replicas)


def _slots(plan: Plan, app: str, service: str, version_ok: Callable[[int], bool]) -> list[SlotAssignment]:
    return [s for slots in plan.values() for s in slots
            if s.app == app and s.service == service and version_ok(s.version)]


def _in(replica_ids: frozenset[str]) -> Callable[[SlotAssignment], bool]:
    return lambda s: s.replica_id in replica_ids


def _drop(plan: Plan, doomed: Callable[[SlotAssignment], bool]) -> None:
    for nid, slots in plan.items():
        plan[nid] = [s for s in slots if not doomed(s)]
