"""An app deleted and pushed again under its name before the control loop saw it gone starts over at version 1
with another bundle: the old app's replicas, still in the plan as version 1, are found by their bundle and replaced
(they would otherwise serve the new app's calls with the old code)."""

from __future__ import annotations

from support.builders import deployment, service_spec, slot

from ember_platform.control.plan import of_another_push


def test_slots_of_another_bundle_of_their_version_are_the_old_apps() -> None:
    new = deployment(service_spec("s"))  # app "a", version 1, bundle "x"
    plan = {"n1": [slot("old", bundle_sha256="y"), slot("new", bundle_sha256="x")],
            "n2": [slot("unknown"),  # a slot from before slots named their bundle: left alone
                   slot("gone", version=7, bundle_sha256="y"),  # a version the app no longer keeps: switching's
                   slot("other", bundle_sha256="y", app="b")]}  # an app not deployed: dropped with it
    assert [s.replica_id for s in of_another_push(plan, {"a": new})] == ["old"]
    assert of_another_push(plan, {}) == []
