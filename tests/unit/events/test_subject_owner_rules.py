"""What an app may bind: its own events.<app> subjects and what an admin granted it, never another app's, and never
subjects that overlap another app's bindings."""

from __future__ import annotations

import pytest

from ember._errors import ConflictError, InvalidInputError
from ember.wire import Deployment, FunctionSpec, Manifest, ServiceSpec
from ember.wire.grants import SubjectGrant
from ember_platform.auth.scopes import Principal
from ember_platform.events.subjects import (
    allowed_patterns,
    bound_subjects,
    check_bindings,
    check_overlap,
    check_ownership,
    result_subjects,
)

GRANT = SubjectGrant(pattern="orders.>", apps=["tenant-*"])


def manifest(app: str, *bound: tuple[list[str], str | None]) -> Manifest:
    functions = [FunctionSpec(name=f"f{i}", attr=f"f{i}", input_mode="single", on=on, result_subject=result)
                 for i, (on, result) in enumerate(bound)]
    return Manifest(app=app, module="m", services=[ServiceSpec(name="svc", kind="function", functions=functions)])


def deployed(*manifests: Manifest) -> dict[str, Deployment]:
    return {m.app: Deployment(app=m.app, version=1, bundle_sha256="0" * 64, created_at=0.0, manifest=m)
            for m in manifests}


def refused(error: type[Exception], call: object, *args: object) -> Exception:
    with pytest.raises(error) as caught:
        call(*args)  # type: ignore[operator]
    return caught.value


def test_an_app_binds_its_own_events_subjects() -> None:
    check_ownership(manifest("tenant-a", (["events.tenant-a.in.>", "events.tenant-a"], "events.tenant-a.out")), [])


@pytest.mark.parametrize(("bound", "field"), [
    ((["events.team-b-app.>"], None), "$.manifest.services[0].functions[0].on[0]"),
    ((["events.tenant-a.x", "orders.>"], None), "$.manifest.services[0].functions[0].on[1]"),
    ((["events.>"], None), "$.manifest.services[0].functions[0].on[0]"),
    ((["events.*.in"], None), "$.manifest.services[0].functions[0].on[0]"),
    ((["events.tenant-ab.in"], None), "$.manifest.services[0].functions[0].on[0]"),
    ((["events.tenant-a.in"], "events.team-b-app.in"), "$.manifest.services[0].functions[0].result_subject"),
])
def test_another_apps_or_an_ungranted_subject_is_a_422_naming_the_field(bound: tuple[list[str], str | None],
                                                                        field: str) -> None:
    error = refused(InvalidInputError, check_ownership, manifest("tenant-a", bound), [])
    assert error.field == field  # type: ignore[attr-defined]
    assert "ember subject grant" in str(error) and "events.tenant-a.>" in str(error)


def test_a_grant_lets_the_apps_it_names_bind_inside_it() -> None:
    bound = manifest("tenant-a", (["orders.eu.*"], "orders.done"))
    check_ownership(bound, [GRANT])
    assert allowed_patterns("tenant-a", [GRANT]) == ["events.tenant-a", "events.tenant-a.>", "orders.>"]
    error = refused(InvalidInputError, check_ownership, manifest("team-b", (["orders.eu.*"], None)), [GRANT])
    assert error.field == "$.manifest.services[0].functions[0].on[0]"  # type: ignore[attr-defined]


def test_two_apps_never_bind_overlapping_subjects() -> None:
    first = manifest("tenant-one", (["orders.eu.>"], None))
    second = manifest("tenant-two", (["orders.*.created"], None))
    error = refused(ConflictError, check_bindings, second, [GRANT], deployed(first))
    assert error.field == "$.manifest.services[0].functions[0].on[0]"  # type: ignore[attr-defined]
    assert "tenant-one" not in str(error) and "orders.eu" not in str(error)  # nothing of the other app is told
    check_bindings(manifest("tenant-two", (["orders.us.created"], None)), [GRANT], deployed(first))
    check_bindings(first, [GRANT], deployed(first))  # an app pushed again is no conflict with itself


def test_one_apps_own_functions_do_not_overlap_either() -> None:
    both = manifest("tenant-a", (["events.tenant-a.>"], None), (["events.tenant-a.x"], None))
    error = refused(InvalidInputError, check_overlap, both, {})
    assert error.field == "$.manifest.services[0].functions[1].on[0]"  # type: ignore[attr-defined]


def test_an_events_client_publishes_to_what_its_apps_bind() -> None:
    apps = deployed(manifest("tenant-a", (["events.tenant-a.in.>"], "events.tenant-a.out")),
                    manifest("team-b", (["events.team-b.>"], "events.team-b.done")))
    tenant = Principal("t1", frozenset({"events"}), ["tenant-*"])
    assert bound_subjects(apps, tenant) == ["events.tenant-a.in.>"]
    assert result_subjects(apps, tenant) == ["events.tenant-a.out"]
    admin = Principal("t2", frozenset({"admin"}), ["*"])
    assert bound_subjects(apps, admin) == ["events.team-b.>", "events.tenant-a.in.>"]
