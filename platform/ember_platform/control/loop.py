"""The control loop: keeps every deployed service at its desired replica count, placed on live nodes.

Each tick it reads the nodes' inventories, the replicas' reports and what the gateway knows (calls in flight
and received, and the replicas' estimates of their capacity from their load reports), asks the pure policies
(``scheduler.measure``, ``scheduler.desired_replicas``, ``scheduler.place_and_apply``, ``scheduler.rebalance``)
what to run where, and writes each node's ``NodeAssignment``; node agents run what is assigned to them. A node
that stops reporting loses its assignment and its replicas are placed elsewhere; a new version's replicas are
placed beside the old ones; once its minimum replicas are ready (and, replacing a version that served, at least
as many as that one had ready, one at least for a canary) the loop switches the app's traffic to it (the
deployment in KV, see ``rollout`` and ``switching``), and the versions that left the traffic are removed
``DRAIN_GRACE_S`` later (every gateway routes by then to the new one; each removed replica finishes what it
holds). Rebalancing moves are make-before-break the same way: the replacement is assigned next to the replica it
replaces, which is removed once the replacement is ready (or the move is given up after ``MOVE_TIMEOUT_S``); a
replacement counts as neither a new replica nor one that may be scaled down.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from ember._loop import cancel_and_wait
from ember.wire import (
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
from ember.wire.jetstream import NODE_LOST_S, KVMirror, Stores
from ember.wire.quotas import Quota
from ember_platform.control.backlog import Backlog
from ember_platform.control.bundle_gc import BundleCollector
from ember_platform.control.lease import Lease
from ember_platform.control.pace import until_next_tick
from ember_platform.control.plan import (
    Plan,
    assign,
    cluster_snapshot,
    new_replica_id,
    of_another_push,
    on_faulty_gpus,
    replica_request,
    slot_request,
    surplus,
    to_replace,
)
from ember_platform.control.preloader import Preloader
from ember_platform.control.registry import Registry
from ember_platform.control.service_state import Moving, ServiceState
from ember_platform.control.switching import Switching
from ember_platform.quotas.caps import Want, cap, replica_gpu_mb
from ember_platform.scheduler import (
    AutoscaleConfig,
    Binding,
    MoveBudget,
    PlacementRequest,
    Reservation,
    Signals,
    Snapshot,
    desired_replicas,
    initial_state,
    measure,
    place_and_apply,
    rebalance,
    request_from_spec,
)
from ember_platform.scheduler.autoscale import in_flight_target

log = logging.getLogger("ember.control")
MOVE_TIMEOUT_S = 600.0  # a replacement not ready by then is given up, and the replica it was for stays
T = TypeVar("T")


@dataclass
class ControlLoop:
    registry: Registry
    stores: Stores
    gateway_load: Callable[[str, str], int]  # (app, service) -> calls in flight at the gateway
    gateway_received: Callable[[str, str], int]  # (app, service) -> synchronous calls received so far
    gateway_capacity: Callable[[str, str], float | None]  # (app, service) -> calls/s a replica serves, estimated
    js: Any
    services: dict[tuple[str, str], ServiceState] = field(default_factory=dict)
    pending: dict[tuple[str, str], int] = field(default_factory=dict)  # (app, function) -> durable backlog
    moves: dict[str, Moving] = field(default_factory=dict)  # by the replacement's replica id
    move_budget: MoveBudget = field(default_factory=MoveBudget)
    failures: dict[tuple[str, str], str] = field(default_factory=dict)  # services skipped by the last tick, and why
    lease: Lease | None = None  # several control planes: only the lease holder acts; None: always act
    quotas: Callable[[], Iterable[Quota]] = tuple  # the quotas now (those on apps cap the replicas)
    replaced: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (app, service, why): gave way
    faulty: dict[str, str] = field(default_factory=dict)  # replica id -> why, on a GPU out of service (last tick)
    _services_at: tuple[int, list[tuple[Deployment, ServiceSpec]]] = (-1, [])
    _placed: tuple[int, dict[str, str]] = (-1, {})  # the assignments' generation, and replica id -> its node then

    async def start(self) -> None:
        self.switching = Switching(self.registry)
        self.preloader = Preloader(demand=self._arrival_rate)
        self.backlog = Backlog(self.js)
        self.nodes: KVMirror[NodeInfo] = KVMirror(self.stores.nodes, node_decoder.decode)
        self.assignments: KVMirror[NodeAssignment] = KVMirror(self.stores.assignments, assignment_decoder.decode,
                                                              heal=encoder.encode)
        await self.nodes.start()
        await self.assignments.start()
        self.registry.replicas.know_assignments(self._assigned_node)
        self.bundle_gc = BundleCollector(self.stores, self.js, self._bundles_in_use)
        self._task = asyncio.create_task(self._run(), name="control-loop")

    def _assigned_node(self, replica_id: str) -> str | None:
        """The node the scheduler assigned ``replica_id`` to, as the assignments say now (None: none lists it).
        Asked at every replica's status write: read from an index made again when the assignments change (a scan
        of every slot each time made a round of heartbeats cost the square of the replicas: 2 s of CPU at 8,000)."""
        generation, index = self._placed
        if generation != self.assignments.generation:
            index = {slot.replica_id: node_id for node_id, assignment in self.assignments.items.items()
                     for slot in assignment.slots}
            self._placed = (self.assignments.generation, index)
        return index.get(replica_id)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        await self.bundle_gc.stop()
        await self.nodes.stop()
        await self.assignments.stop()

    async def stop_acting(self) -> None:
        """Give the lease up (a clean stop): a standby control plane takes over at once."""
        if self.lease is not None:
            await self.lease.release()

    @property
    def active(self) -> bool:
        return self.lease is None or self.lease.held

    async def _run(self) -> None:
        while True:
            try:
                self.registry.replicas.recheck()  # statuses of replicas placed since: the assignments list them now
                was_active = self.active
                if self.lease is None or await self.lease.hold():
                    if not was_active:
                        self._forget()  # what it knew as a standby is stale: rebuilt from measurements
                    await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("control loop tick failed")
            try:
                if self.active:  # in the background, at most every EMBER_BUNDLE_GC_INTERVAL_S
                    self.bundle_gc.poke()
            except Exception:
                log.exception("bundle collection could not start")
            await until_next_tick(self.registry.deployments.changed)

    def _bundles_in_use(self) -> set[str]:
        """The bundles of the deployments and the versions they keep (for rollback), and of every slot and zygote
        assigned to a node."""
        used = {dep.bundle_sha256 for dep in self.registry.deployments.items.values()}
        used.update(r.bundle_sha256 for dep in self.registry.deployments.items.values() for r in dep.releases)
        for assignment in self.assignments.items.values():
            used.update(s.bundle_sha256 for s in assignment.slots)
            used.update(z.bundle_sha256 for z in assignment.zygotes)
        return used

    def _forget(self, deployed: Container[str] | None = None) -> None:
        """Forgets what it knew of every service (``deployed`` None: it just took the lease, and what it knew as a
        standby is stale), or of the apps not ``deployed`` (deleted: an app pushed again under the name starts
        afresh, without the autoscaler's state, replacements or notes of the one before)."""
        tables: tuple[dict[Any, Any], ...] = (self.services, self.failures)
        for table in tables if deployed is None else (*tables, self.replaced):
            for key in [k for k in table if deployed is None or k[0] not in deployed]:
                del table[key]
        if deployed is None:
            self.moves.clear()

    def live_nodes(self) -> dict[str, NodeInfo]:
        fresh_after = time.time() - NODE_LOST_S
        return {nid: n for nid, n in sorted(self.nodes.items.items()) if n.updated_at > fresh_after}

    async def tick(self) -> None:
        now = time.time()
        nodes = self.live_nodes()
        plan: Plan = {nid: list(a.slots) for nid, a in self.assignments.items.items() if nid in nodes}
        for nid in nodes:
            plan.setdefault(nid, [])
        # a push while this tick awaits changes the mirror: the tick works on a copy, as of ``generation``
        deployments, generation = dict(self.registry.deployments.items), self.registry.deployments.generation
        await self.backlog.refresh(deployments, generation)
        self.pending = self.backlog.pending
        _drop(plan, lambda s: s.app not in deployments)
        if stale := {s.replica_id: s.app for s in of_another_push(plan, deployments)}:
            log.warning("%d replica(s) of %s run code of a deleted app of the name: replaced", len(stale),
                        ", ".join(sorted(set(stale.values()))))
            _drop(plan, lambda s: s.replica_id in stale)
            self._forget(set(deployments) - set(stale.values()))  # and what was known of it
        await self.switching.refresh_pinned(plan, deployments)
        versions: dict[str, set[int]] = defaultdict(set)  # the versions with slots, by app: only an app with a slot
        for slots in plan.values():  # of a version that takes no traffic has one to drop (not every app, each tick)
            for slot in slots:
                versions[slot.app].add(slot.version)
        for app, held in versions.items():
            if (dep := deployments.get(app)) is not None and held - dep.running():
                self.switching.drop_gone(plan, dep, now)
        self._finish_moves(plan, now)
        self.faulty = on_faulty_gpus(plan, nodes)
        busy = {(s.app, s.service) for slots in plan.values() for s in slots}
        busy.update((r.app, r.service) for r in self.registry.replicas.items.values())
        services = [(dep, svc) for dep, svc in self._every_service(deployments, generation)
                    if not self._quiet(dep, svc, busy)]
        wanted = {(dep.app, svc.name): (dep, svc, n) for dep, svc in services
                  if (n := self._isolated(dep, svc, functools.partial(self._want, plan, dep, svc, now))) is not None}
        targets = self._capped(wanted, nodes)
        requests: list[tuple[PlacementRequest, SlotAssignment]] = []
        for dep, svc in services:
            if (dep.app, svc.name) in targets:
                requests += self._isolated(dep, svc, functools.partial(
                    self._reconcile_service, plan, dep, svc, targets[(dep.app, svc.name)]), last=True) or []
        requests += [slot_request(at, svc, i) for at, svc, i in self.switching.missing(plan, deployments)
                     if (at.app, svc.name) in self.services]  # a version serving beside a rollout keeps its minimum
        snapshot = cluster_snapshot(plan, nodes, deployments)
        snapshot, unplaced = self._place(plan, snapshot, requests)
        self._rebalance(plan, snapshot, unplaced, deployments, now)
        self._note_quiet(services, plan)
        zygotes = self.preloader.zygotes(plan, nodes, deployments,
                                         functools.partial(cluster_snapshot, plan, nodes, deployments), now,
                                         {r.replica_id for r in self.registry.replicas.items.values()})
        await self._write(plan, zygotes, now)
        deployments |= await self.switching.switch(plan, deployments)
        await self.switching.hold_standby(plan, deployments)  # as switched: a version that just left is told

    def _every_service(self, deployments: dict[str, Deployment],
                       generation: int) -> list[tuple[Deployment, ServiceSpec]]:
        """Each deployment's services, listed again only once the deployments changed (``KVMirror.generation``)."""
        if self._services_at[0] != generation:
            self._services_at = generation, [(d, s) for d in deployments.values() for s in d.manifest.services]
            self._forget(deployments)
        return self._services_at[1]

    def _quiet(self, dep: Deployment, svc: ServiceSpec, busy: set[tuple[str, str]]) -> bool:
        """Whether ``svc`` needs no reconcile this tick: last reconciled to no replica as this very deployment, and
        since then no replica of it placed or reporting (``busy``), no call at the gateway nor in its queues. An
        idle platform's ticks then cost what its running and changing services do, not every deployed one."""
        key = (dep.app, svc.name)
        state = self.services.get(key)
        if state is None or state.quiet_as is not dep or key in busy:
            return False
        if self.gateway_load(*key) or self.gateway_received(*key) != state.quiet_received:
            return False
        return not any(self.pending.get((dep.app, fn.name)) for fn in svc.functions)

    def _note_quiet(self, services: list[tuple[Deployment, ServiceSpec]], plan: Plan) -> None:
        """The services reconciled this tick that came to no replica, nothing held back and nothing failed."""
        placed = {(s.app, s.service) for slots in plan.values() for s in slots}
        for dep, svc in services:
            key = (dep.app, svc.name)
            state = self.services.get(key)
            if state is None:
                continue
            quiet = (not state.desired and not state.arrival_rate and not state.unschedulable and not state.quota
                     and key not in placed and key not in self.failures)
            state.quiet_as, state.quiet_received = (dep, self.gateway_received(*key)) if quiet else (None, -1)

    def _isolated(self, dep: Deployment, svc: ServiceSpec, step: Callable[[], T], last: bool = False) -> T | None:
        """One step of one service's reconcile, so that a service whose reconcile raises (a manifest that got past
        the validator, a bug) is skipped and shown as failed while every other service is still placed and scaled."""
        key = (dep.app, svc.name)
        try:
            result = step()
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if self.failures.get(key) != reason:
                log.exception("%s.%s (v%d) cannot be reconciled; skipping it", dep.app, svc.name, dep.version)
            self.failures[key] = reason
            return None
        if last:
            self.failures.pop(key, None)
        return result

    def _want(self, plan: Plan, dep: Deployment, svc: ServiceSpec, now: float) -> int:
        """The autoscaler's count for ``svc``, before quotas; it raises (this service alone is skipped) for a GPU
        request the scheduler cannot read, which the steps after it, over every service at once, read again."""
        request_from_spec(svc)
        state = self.services.get((dep.app, svc.name))
        if state is None:  # first seen here: a new service, or this control plane restarted or took over
            running = len(_slots(plan, dep.app, svc.name, lambda v: v == dep.version))
            state = self.services[(dep.app, svc.name)] = ServiceState(
                autoscale=initial_state(_config(dep, svc), running=running))
        replicas = {r.replica_id: r for r in self.registry.live_replicas(dep.app, svc.name)}
        return max(self._target(state, dep, svc, replicas, now), self.switching.floor(dep, svc))

    def _capped(self, wanted: dict[tuple[str, str], tuple[Deployment, ServiceSpec, int]],
                nodes: dict[str, NodeInfo]) -> dict[tuple[str, str], int]:
        """The counts ``wanted`` within the apps quotas' ``max_replicas`` and ``max_gpu_memory_mb``
        (``quotas.caps``); a service held back says why in its state, and once in the log."""
        devices = [d for n in nodes.values() for d in n.devices]
        wants = [Want(app=dep.app, service=svc.name, minimum=_config(dep, svc).min_replicas, wanted=n,
                      gpu_mb=replica_gpu_mb(request_from_spec(svc), devices))
                 for _, (dep, svc, n) in sorted(wanted.items(), key=lambda kv: kv[0])]
        targets = {}
        for key, capped in cap(self.quotas(), wants).items():
            state = self.services[key]
            if capped.reason != state.quota:
                if capped.reason:
                    log.warning("%s.%s: %s", *key, capped.reason)
                else:
                    log.info("%s.%s: no longer held back by a quota", *key)
            state.quota, state.desired, targets[key] = capped.reason, capped.allowed, capped.allowed
        return targets

    def _reconcile_service(self, plan: Plan, dep: Deployment, svc: ServiceSpec,
                           target: int) -> list[tuple[PlacementRequest, SlotAssignment]]:
        replicas = {r.replica_id: r for r in self.registry.live_replicas(dep.app, svc.name)}
        current = _slots(plan, dep.app, svc.name, lambda v: v == dep.version)
        state = self.services[(dep.app, svc.name)]
        # A replica that stops on its own while assigned, or runs on a GPU out of service, is replaced, counted once
        # by why; it goes once its replacement serves, or at once when the replacement has no room.
        leaving = to_replace(current, replicas, self.faulty)
        for rid in leaving.keys() - state.gave_way:
            why, said = leaving[rid]
            state.gave_way.add(rid)
            self.replaced[(dep.app, svc.name, why)] += 1
            state.last_replaced = (time.time(), said or why)
            log.warning("%s.%s: replacing replica %s (%s): %s", dep.app, svc.name, rid, why, said)
        state.gave_way &= replicas.keys() | self.faulty.keys()
        ready_now = sum(replicas.get(s.replica_id, _NONE).state == "ready" for s in current
                        if s.replica_id not in leaving)
        if leaving and (ready_now >= target or state.unschedulable):
            _drop(plan, lambda s: s.replica_id in leaving)
        moving = self._moving()
        count = len(current) - sum(s.replica_id in self.moves or s.replica_id in leaving for s in current)
        if count > target:
            doomed = surplus(current, replicas, count - target, keep=moving | leaving.keys())
            _drop(plan, lambda s: s.replica_id in doomed)
        used = {s.index for s in current}
        free = (i for i in range(10_000) if i not in used)
        missing = [next(free) for _ in range(target - count)]
        return [slot_request(dep, svc, i) for i in missing]

    def _target(self, state: ServiceState, dep: Deployment, svc: ServiceSpec,
                replicas: dict[str, ReplicaStatus], now: float) -> int:
        """The autoscaler's count, from the load measured on the current version's replicas."""
        mine = [r for r in replicas.values() if r.version == dep.version]
        load, state.meter = measure(state.meter, mine, now, received=self.gateway_received(dep.app, svc.name),
                                    capacity=self.gateway_capacity(dep.app, svc.name))
        signals = Signals(
            now=now, ready=sum(r.state == "ready" for r in mine),
            starting=sum(r.state == "starting" and r.replica_id not in self.moves for r in mine),
            queue_depth=load.queue_depth,
            durable_pending=sum(self.pending.get((dep.app, f.name), 0) for f in svc.functions),
            in_flight=max(self.gateway_load(dep.app, svc.name), load.in_flight), arrival_rate=load.arrival_rate,
            throughput_per_replica=load.throughput_per_replica, startup_s=load.startup_s, p95_ms=load.p95_ms)
        count, state.autoscale = desired_replicas(signals, _config(dep, svc), state.autoscale)
        state.desired, state.arrival_rate = count, load.arrival_rate
        return count

    def _arrival_rate(self, app: str, service: str) -> float:
        state = self.services.get((app, service))
        return state.arrival_rate if state is not None else 0.0

    def _place(self, plan: Plan, snapshot: Snapshot, requests: list[tuple[PlacementRequest, SlotAssignment]],
               ) -> tuple[Snapshot, list[PlacementRequest]]:
        """Binds what fits into ``plan``; returns the snapshot after it, and the requests that did not fit."""
        if not requests:
            return snapshot, []
        decisions, snapshot = place_and_apply(snapshot, [request for request, _ in requests])
        unplaced = []
        for (request, slot), decision in zip(requests, decisions, strict=True):
            state = self.services[(slot.app, slot.service)]
            if not isinstance(decision, Binding):
                if state.unschedulable != decision.reason:
                    log.warning("%s.%s: cannot place a replica: %s", slot.app, slot.service, decision.reason)
                state.unschedulable = decision.reason
                unplaced.append(request)
                continue
            state.unschedulable = ""
            _drop(plan, _in(frozenset(decision.preempts)))
            assign(plan, msgspec.structs.replace(slot, replica_id=request.replica_id), decision)
        return snapshot, unplaced

    # --- rebalancing: make-before-break moves ----------------------------------------------------

    def _moving(self) -> set[str]:
        """Both ends of every move in flight."""
        return {x for replica_id, m in self.moves.items() for x in (replica_id, m.move.replica_id)}

    def _finish_moves(self, plan: Plan, now: float) -> None:
        """A replacement that is ready takes over: the replica it replaces is removed. A move that lost either
        end (a node loss, a scale-down) is forgotten; one whose replacement is late is given up."""
        assigned = {s.replica_id for slots in plan.values() for s in slots}
        for new_id, moving in list(self.moves.items()):
            old_id = moving.move.replica_id
            if new_id in assigned and old_id in assigned:
                status = self.registry.replicas.items.get(new_id)
                if status is not None and status.state == "ready":
                    _drop(plan, _in(frozenset({old_id})))
                elif now - moving.since > MOVE_TIMEOUT_S:
                    log.warning("gave up moving %s: its replacement %s is not ready", old_id, new_id)
                    _drop(plan, _in(frozenset({new_id})))
                else:
                    continue
            del self.moves[new_id]

    def _rebalance(self, plan: Plan, snapshot: Snapshot, unplaced: list[PlacementRequest],
                   deployments: dict[str, Deployment], now: float) -> None:
        budget = self.move_budget.available(now)
        if not budget:
            return
        slots = {s.replica_id: s for node_slots in plan.values() for s in node_slots}
        held = {s.app for s in slots.values()} & deployments.keys()  # only a replica that runs may be moved
        templates = {f"{app}.{svc.name}": replica_request(deployments[app], svc, "") for app in held
                     for svc in deployments[app].manifest.services}
        moving = self._moving()
        helped = {m.move.room_for for m in self.moves.values()}

        def movable(r: Reservation) -> bool:
            slot = slots.get(r.replica_id)
            status = self.registry.replicas.items.get(r.replica_id)
            return (slot is not None and r.replica_id not in moving and status is not None and status.state == "ready"
                    and slot.app in deployments and slot.version == deployments[slot.app].version)

        def new_id(old: str) -> str:
            s = slots[old]
            return new_replica_id(s.app, s.service, s.version, s.index)

        pending = [p for p in unplaced if p.function not in helped]
        moves = rebalance(snapshot, pending, templates, movable, new_id, budget)
        for move in moves:
            log.info("moving %s to %s (%s)", move.replica_id, move.binding.node_id, move.reason)
            assign(plan, msgspec.structs.replace(slots[move.replica_id], replica_id=move.binding.replica_id),
                    move.binding)
            self.moves[move.binding.replica_id] = Moving(move, now)
        self.move_budget = self.move_budget.spend(now, len(moves))

    async def _write(self, plan: Plan, zygotes: dict[str, list[ZygoteAssignment]], now: float) -> None:
        for nid in set(plan) | set(self.assignments.items):
            if not self.active:  # the lease ran out during the tick (a stalled JetStream): another may hold it now
                log.warning("the control lease ran out during a tick: its plan is not written")
                return
            slots = sorted(plan.get(nid, []), key=lambda s: s.replica_id)
            preload = zygotes.get(nid, [])
            old = self.assignments.items.get(nid)
            if old is not None and old.slots == slots and old.zygotes == preload:
                continue
            if nid not in plan:  # a node that is gone: forget it
                with contextlib.suppress(Exception):
                    await self.stores.assignments.delete(nid)
                    self.assignments.record(nid, None, 0)
                continue
            assignment = NodeAssignment(node_id=nid, slots=slots, updated_at=now, zygotes=preload)
            revision = await self.stores.assignments.put(nid, encoder.encode(assignment))
            self.assignments.record(nid, assignment, revision)


class _Absent:
    state = "absent"


_NONE: Any = _Absent()


def _config(dep: Deployment, svc: ServiceSpec) -> AutoscaleConfig:
    low, high = dep.bounds(svc)
    return AutoscaleConfig(min_replicas=low, max_replicas=max(high, low, 1), scaledown_window_s=svc.scaledown_window_s,
                           buffer_replicas=svc.buffer_replicas, target_p95_ms=svc.target_p95_ms,
                           target_in_flight=in_flight_target(max(f.max_concurrency for f in svc.functions)))


def _slots(plan: Plan, app: str, service: str, version_ok: Callable[[int], bool]) -> list[SlotAssignment]:
    return [s for slots in plan.values() for s in slots
            if s.app == app and s.service == service and version_ok(s.version)]


def _in(replica_ids: frozenset[str]) -> Callable[[SlotAssignment], bool]:
    return lambda s: s.replica_id in replica_ids


def _drop(plan: Plan, doomed: Callable[[SlotAssignment], bool]) -> None:
    for nid, slots in plan.items():
        plan[nid] = [s for s in slots if not doomed(s)]
