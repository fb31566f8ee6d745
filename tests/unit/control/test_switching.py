"""The control loop's rollout decisions from plain data: how many replicas a new version needs before it takes the
calls, when it is ready, and what a version serving beside it keeps."""

from __future__ import annotations

import asyncio
from typing import Any

from support.builders import service_spec, slot

from ember.wire import Deployment, DeployRequest, Manifest, ReplicaState, ReplicaStatus, subjects
from ember_platform.control import rollout
from ember_platform.control.switching import Switching


class _Registry:
    """What ``Switching`` reads of the registry: the live replicas."""

    def __init__(self, *replicas: ReplicaStatus) -> None:
        self.replicas = list(replicas)

    def live_replicas(self, app: str, service: str | None = None) -> list[ReplicaStatus]:
        return [r for r in self.replicas if r.app == app and service in (None, r.service)]


def _replica(replica_id: str, version: int, state: ReplicaState = "ready") -> ReplicaStatus:
    return ReplicaStatus(replica_id=replica_id, node_id="n", app="a", service="s", version=version, state=state,
                         pid=1, started_at=0.0, updated_at=1.0)


def _push(current: Deployment | None, min_replicas: int, canary: int = 0) -> Deployment:
    manifest = Manifest(app="a", module="m", services=[service_spec(min_replicas=min_replicas, max_replicas=4)])
    dep = rollout.record_push(current, "a", DeployRequest(bundle_sha256="x", manifest=manifest,
                                                          canary_percent=canary), 0.0)
    return dep


def _switching(*replicas: ReplicaStatus) -> Switching:
    registry: Any = _Registry(*replicas)
    return Switching(registry)


def test_a_new_version_needs_as_many_ready_replicas_as_the_one_it_replaces() -> None:
    v2 = _push(_push(None, min_replicas=0), min_replicas=0)  # v1 serves, scaled up by load to three replicas
    svc = v2.manifest.services[0]
    old = [_replica(f"old-{i}", 1) for i in range(3)]
    assert _switching(*old).floor(v2, svc) == 3  # min_replicas=0, yet no call may wait for a cold start
    assert not _switching(*old, _replica("new-0", 2), _replica("new-1", 2)).ready(v2)
    assert not _switching(*old, *(_replica(f"new-{i}", 2, "starting") for i in range(3))).ready(v2)
    assert _switching(*old, *(_replica(f"new-{i}", 2) for i in range(3))).ready(v2)
    assert _switching().floor(v2, svc) == 0 and _switching().ready(v2)  # nothing served: nothing to wait for


def test_a_canary_keeps_one_replica_and_a_switched_version_none() -> None:
    v1 = _push(None, min_replicas=0)
    canary = _push(v1, min_replicas=0, canary=20)
    svc = canary.manifest.services[0]
    old = [_replica(f"old-{i}", 1) for i in range(3)]
    assert _switching(*old).floor(canary, svc) == 1
    live = rollout.switch(canary, True, 1.0)
    assert live is not None and _switching(*old).floor(live, svc) == 1  # while the canary takes its share
    done = rollout.switch(rollout.promote(live, 2.0), True, 3.0)
    assert done is not None and _switching(*old).floor(done, svc) == 0


def test_a_version_serving_beside_a_rollout_keeps_its_minimum() -> None:
    v1 = _push(None, min_replicas=2)
    v2 = _push(v1, min_replicas=1)
    switching = _switching()
    plan = {"n": [slot("a-s-v1-0", version=1, index=0), slot("a-s-v2-0", version=2, index=0)]}
    lacking = switching.missing(plan, {"a": v2})
    assert [(at.version, svc.name, index) for at, svc, index in lacking] == [(1, "s", 1)]  # v1 lost a replica
    plan["n"].append(slot("a-s-v1-1", version=1, index=1))
    assert switching.missing(plan, {"a": v2}) == []
    done = rollout.switch(v2, True, 1.0)
    assert done is not None and switching.missing({"n": []}, {"a": done}) == []  # v1 left: it keeps nothing


def test_the_warm_version_keeps_its_minimum_of_replicas_for_its_window(monkeypatch: Any) -> None:
    monkeypatch.setenv("EMBER_KEEP_PREVIOUS_S", "60")
    v1 = rollout.switch(_push(None, 1), True, 0.0) or _push(None, 1)
    v2 = rollout.switch(_push(v1, 1), True, 10.0)
    assert v2 is not None and v2.warm == 1
    plan = {"n": [slot("a-s-v1-0", version=1, index=0),
                  slot("a-s-v1-1", version=1, index=1),
                  slot("a-s-v2-0", version=2, index=0)]}
    switching = _switching(_replica("a-s-v1-0", 1), _replica("a-s-v1-1", 1), _replica("a-s-v2-0", 2))
    switching.registry.replica_alive = lambda _id: True  # type: ignore[method-assign]
    switching.drop_gone(plan, v2, 11.0)  # draining: all stay
    assert len(plan["n"]) == 3
    switching.drop_gone(plan, v2, 20.0)  # warm: its minimum stays
    assert [s.replica_id for s in plan["n"]] == ["a-s-v1-0", "a-s-v2-0"]
    switching.drop_gone(plan, v2, 71.0)  # after the window: released
    assert [s.replica_id for s in plan["n"]] == ["a-s-v2-0"]
    monkeypatch.setenv("EMBER_KEEP_PREVIOUS_S", "0")
    plan = {"n": [slot("a-s-v1-0", version=1, index=0)]}
    switching.drop_gone(plan, v2, 13.0)  # no window: gone after the drain
    assert plan["n"] == []


class _Published:
    def __init__(self) -> None:
        self.subjects: list[str] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.subjects.append(subject)


def test_a_version_not_yet_switched_to_pulls_no_queued_call() -> None:
    """Before, only versions out of ``running()`` (which holds the version rolled out) were held on standby: a new
    version, or a canary, pulled its app's queued calls and events as soon as one replica was up, ready to take the
    calls or not (one that never becomes ready failed them)."""
    v2 = _push(_push(None, min_replicas=1), min_replicas=1)
    assert [s.version for s in v2.serving()] == [1] and v2.running() == {1, 2}
    switching = _switching()
    switching.registry.nc = _Published()
    plan = {"n": [slot("old", version=1), slot("new", version=2)]}
    asyncio.run(switching.hold_standby(plan, {"a": v2}))
    assert switching.registry.nc.subjects == [subjects.replica_standby("new")]
    switched = rollout.switch(v2, True, 1.0)
    assert switched is not None
    switching.registry.nc = _Published()
    asyncio.run(switching.hold_standby(plan, {"a": switched}))
    assert switching.registry.nc.subjects == [subjects.replica_standby("old")]
