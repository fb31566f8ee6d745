"""The control loop's part in rollouts (see ``rollout`` for the rules): how many replicas a version being rolled out
needs before it takes traffic, the switch once it has them, and which versions' replicas stay while they drain.

Only the control plane holding the lease runs this; the switch is a compare-and-set on the app's deployment in KV,
so a standby that took over (or a push meanwhile) never switches on stale state.

The version that last left an app's traffic (``Deployment.warm``) keeps, for ``EMBER_KEEP_PREVIOUS_S`` (600 by
default; 0: none), ``max(min_replicas, 1)`` replicas of each service: they hold their node's room but take no
calls (the gateways route no unpinned call to a version out of the traffic, and the loop keeps telling them, on
``subjects.replica_standby``, to pull nothing from the queues, as it tells those that drain), and count against no
quota, which caps the versions that serve. A rollback to it switches at once; after the window it is released and
starts again as any version.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from ember.wire import Deployment, ServiceSpec, SlotAssignment, subjects
from ember_platform.control import rollout
from ember_platform.control.registry import Registry

log = logging.getLogger("ember.control")
DRAIN_GRACE_S = 2.0  # versions that left an app's traffic keep their replicas this long (gateways catch up)
Plan = dict[str, list[SlotAssignment]]  # node id -> its slots


def keep_previous_s() -> float:
    """How long the version that left an app's traffic stays warm (``EMBER_KEEP_PREVIOUS_S``; 600 by default)."""
    try:
        return max(float(os.environ.get("EMBER_KEEP_PREVIOUS_S", "600")), 0.0)
    except ValueError:
        return 600.0


class Switching:
    """Rollout decisions over the registry's replicas; ``pinned`` holds the backlog of calls pinned to versions that
    are leaving, refreshed each tick."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.pinned: dict[tuple[str, int], int] = {}  # (app, leaving version) -> calls pinned to it, not done

    def floor(self, dep: Deployment, svc: ServiceSpec) -> int:
        """The replicas ``svc``'s new version needs before it takes traffic (and keeps while a canary): as many as
        the versions it replaces have ready (one for a canary, which takes a share), so that no call waits for a cold
        start; 0 when nothing is to switch or none served."""
        if not rollout.rolling_out(dep) and not dep.canary_percent:
            return 0
        others = {s.version for s in dep.serving()} - {dep.version}
        replicas = self.registry.live_replicas(dep.app, svc.name)
        serving = sum(r.version in others and r.state == "ready" for r in replicas)
        if not serving:
            return 0
        return 1 if dep.canary_percent else min(serving, max(dep.bounds(svc)[1], 1))

    def ready(self, dep: Deployment) -> bool:
        """Whether every service of ``dep``'s version has the ready replicas its rollout asks for."""
        for svc in dep.manifest.services:
            replicas = self.registry.live_replicas(dep.app, svc.name)
            ready = sum(r.version == dep.version and r.state == "ready" for r in replicas)
            if ready < max(dep.bounds(svc)[0], self.floor(dep, svc)):
                return False
        return True

    async def switch(self, plan: Plan, deployments: dict[str, Deployment]) -> dict[str, Deployment]:
        """Each app whose version now has its replicas ready takes its traffic (written to KV with compare-and-set:
        every gateway follows); the deployments switched. The replicas of the versions that leave the traffic are
        told first to pull no more queued calls (``hold_standby``): whoever sees the switch, a call queued then runs
        on the version rolled out (which is ready, and pulls)."""
        switched: dict[str, Deployment] = {}
        for dep in list(deployments.values()):
            if not rollout.rolling_out(dep) or not self.ready(dep):  # not ready: nothing to write, no KV round trip
                continue
            staying = {share.version for share in rollout.wanted_traffic(dep)} | {dep.version}
            await self._standby([s for slots in plan.values() for s in slots
                                 if s.app == dep.app and s.version not in staying])
            try:
                after = await self.registry.switch_traffic(dep.app, dep, True)
            except Exception:
                log.exception("could not switch the traffic of %s to v%d", dep.app, dep.version)
                continue
            if after is not None:
                switched[dep.app] = after
                shares = ", ".join(f"v{s.version} {s.percent}%" for s in after.serving())
                log.info("%s: traffic now %s", dep.app, shares)
        return switched

    async def refresh_pinned(self, plan: Plan, deployments: dict[str, Deployment]) -> None:
        """Calls spawned pinned to a version that no longer takes traffic but still has replicas: that version
        keeps them until those calls are done (none is accepted for it any more)."""
        backlog: dict[tuple[str, int], int] = {}
        leaving = {(s.app, s.version) for slots in plan.values() for s in slots if s.app in deployments
                   and s.version not in deployments[s.app].running()}
        for app, version in sorted(leaving):
            release = deployments[app].release(version)
            if release is None:
                continue
            try:
                backlog[(app, version)] = sum([await self.registry.calls.pinned_backlog(app, fn.name, version)
                                               for svc in release.manifest.services for fn in svc.functions])
            except Exception:
                log.exception("could not read the pinned calls of %s v%d", app, version)
                backlog[(app, version)] = self.pinned.get((app, version), 0)
        self.pinned = backlog

    def missing(self, plan: Plan, deployments: dict[str, Deployment]) -> list[tuple[Deployment, ServiceSpec, int]]:
        """The replicas that a version serving beside the one being rolled out (the stable version of a canary, the
        version a rollout replaces) lacks of its own ``min_replicas`` (one crashed for good, its node was lost): it
        still takes calls, so it keeps its guarantee. Each is (that version's deployment, service, free index)."""
        lacking: list[tuple[Deployment, ServiceSpec, int]] = []
        for dep in deployments.values():
            beside = [at for s in dep.serving() if s.version != dep.version and (at := dep.at(s.version)) is not None]
            for at in beside:
                for svc in at.manifest.services:
                    mine = [s.index for slots in plan.values() for s in slots
                            if (s.app, s.service, s.version) == (at.app, svc.name, at.version)]
                    free = (i for i in range(10_000) if i not in mine)
                    lacking += [(at, svc, next(free)) for _ in range(at.bounds(svc)[0] - len(mine))]
        return lacking

    def drop_gone(self, plan: Plan, dep: Deployment, now: float) -> None:
        """The replicas of ``dep``'s app whose version neither takes its traffic nor is rolled out go, once the
        traffic switched ``DRAIN_GRACE_S`` ago (each drains: what it holds finishes, queued calls go back to the
        queue), unless calls pinned to that version still wait for them; the warm version keeps a few."""
        if now - dep.switched_at < DRAIN_GRACE_S:
            return
        keep = dep.running() | {v for (app, v), n in self.pinned.items() if app == dep.app and n}
        warm = warm_version(dep, now)
        _drop(plan, lambda s: s.app == dep.app and s.version not in keep | {warm})
        if warm and warm not in keep:
            _scale_down_warm(plan, dep, warm, self.registry.replica_alive)

    async def hold_standby(self, plan: Plan, deployments: dict[str, Deployment]) -> None:
        """Tell every replica of a version out of its app's traffic (the warm one, those that drain, and the version
        still rolled out) to take no queued call or event for a while (it resumes when no longer told): once the
        traffic switched, the version replaced took its functions' queued calls for its drain grace (2 s), those that
        came after the push too; and a version not yet switched to (a canary not ready, one that never is) took them
        before it took any synchronous call, as soon as one replica of it was up."""
        await self._standby([s for slots in plan.values() for s in slots if (dep := deployments.get(s.app)) is not None
                             and s.version not in {share.version for share in dep.serving()}])

    async def _standby(self, slots: list[SlotAssignment]) -> None:
        for slot in slots:
            try:
                await self.registry.nc.publish(subjects.replica_standby(slot.replica_id), subjects.STANDBY)
            except Exception:
                log.exception("could not hold %s on standby", slot.replica_id)


def warm_version(dep: Deployment, now: float) -> int:
    """``dep``'s warm version while its window lasts and it does not serve; else 0."""
    if not dep.warm or dep.warm in dep.running() or now - dep.warm_since >= keep_previous_s():
        return 0
    return dep.warm


def _scale_down_warm(plan: Plan, dep: Deployment, warm: int, alive: Callable[[str], bool]) -> None:
    """The warm version keeps ``max(min_replicas, 1)`` replicas of each service, live ones first."""
    at = dep.at(warm)
    if at is None:
        return
    extra: set[str] = set()
    for svc in at.manifest.services:
        mine = sorted((s for slots in plan.values() for s in slots
                       if (s.app, s.service, s.version) == (dep.app, svc.name, warm)),
                      key=lambda s: (not alive(s.replica_id), s.index))
        extra.update(s.replica_id for s in mine[max(at.bounds(svc)[0], 1):])
    _drop(plan, lambda s: s.replica_id in extra)


def _drop(plan: Plan, doomed: Callable[[SlotAssignment], bool]) -> None:
    for nid, slots in plan.items():
        plan[nid] = [s for s in slots if not doomed(s)]
