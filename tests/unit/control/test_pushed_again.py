"""An app deleted and pushed again under its name before the control loop saw it gone starts over at version 1
with another bundle: the old app's replicas, still in the plan as version 1, are found by their bundle and replaced
(they would otherwise serve the new app's calls with the old code), and its zygote is planned at once. What is kept
by the app's name alone (a schedule's state) tells the apps apart by when each was first pushed (``born_at``)."""

from __future__ import annotations

import msgspec
from support.builders import deployment, service_spec, slot
from support.placement import A10G, node, snap

from ember.wire import Deployment, DeployRequest, Manifest
from ember.wire.schedules import ScheduleState
from ember_platform.control import rollout
from ember_platform.control.plan import of_another_push
from ember_platform.control.preloader import Preloader


def test_slots_of_another_bundle_of_their_version_are_the_old_apps() -> None:
    new = deployment(service_spec("s"))  # app "a", version 1, bundle "x"
    plan = {"n1": [slot("old", bundle_sha256="y"), slot("new", bundle_sha256="x")],
            "n2": [slot("unknown"),  # a slot from before slots named their bundle: left alone
                   slot("gone", version=7, bundle_sha256="y"),  # a version the app no longer keeps: switching's
                   slot("other", bundle_sha256="y", app="b")]}  # an app not deployed: dropped with it
    assert [s.replica_id for s in of_another_push(plan, {"a": new})] == ["old"]
    assert of_another_push(plan, {}) == []


def test_an_app_pushed_again_under_its_name_gets_its_own_zygote_at_once() -> None:
    n1 = node("n1", A10G, memory_gb=16)
    preloader = Preloader(demand=lambda app, svc: 0.0)

    def bundles(dep: Deployment, now: float) -> list[str]:
        return [z.bundle_sha256 for z in preloader.zygotes({}, {"n1": n1}, {"a": dep}, lambda: snap(n1), now)["n1"]]

    before = deployment(service_spec("s", snap=True, min_replicas=1))  # version 1, bundle "x"
    assert bundles(before, now=0.0) == ["x"]
    again = msgspec.structs.replace(before, bundle_sha256="y")  # deleted, pushed again: version 1, another bundle
    assert bundles(again, now=0.1) == ["y"]  # not the old app's for up to PRELOAD_EVERY_S


def test_an_app_is_told_from_one_of_its_name_deleted_before_by_its_first_push() -> None:
    def push(dep: Deployment | None, sha: str, now: float) -> Deployment:
        request = DeployRequest(bundle_sha256=sha, manifest=Manifest(app="a", module="m", services=[service_spec()]))
        return rollout.record_push(dep, "a", request, now)

    first = push(None, "x", 10.0)
    assert (first.version, first.born_at) == (1, 10.0)
    assert push(first, "y", 20.0).born_at == 10.0  # its later versions keep it
    again = push(None, "x", 30.0)  # deleted, pushed again: version 1 again, the same code even
    assert (again.version, again.born_at) == (1, 30.0)

    paused = ScheduleState(paused=True, last_tick=25.0, runs=7, born_at=first.born_at)
    assert paused.of(first.born_at) is paused
    assert paused.of(again.born_at) == ScheduleState(born_at=30.0)  # another app's: a fresh one
    kept = ScheduleState(paused=True, runs=7)  # written before apps were told apart: kept as it is
    assert kept.of(again.born_at) is kept
    assert paused.of(0.0) is paused  # a deployment an older control plane wrote (it drops born_at): kept too
