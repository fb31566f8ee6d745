"""The one validator of manifests and scale bounds (``ember.wire.validate``), run by the SDK and the platform."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

import ember
from ember._errors import InvalidInputError, InvalidSpecError
from ember._resources import GpuRequest
from ember.wire import FunctionSpec, Manifest, ServiceSpec
from ember.wire.validate import MAX_REPLICAS, check_manifest, check_scale, manifest_problems, subject_problem


def manifest(service: dict[str, Any] | None = None, function: dict[str, Any] | None = None,
             **fields: Any) -> Manifest:
    fn = FunctionSpec(name="f", attr="f", input_mode="single", **(function or {}))
    svc = ServiceSpec(**{"name": "f", "kind": "function", "functions": [fn], **(service or {})})
    return Manifest(**{"app": "hello", "module": "hello", "services": [svc], **fields})


def problems(m: Manifest) -> dict[str, str]:
    return dict(manifest_problems(m))


def test_a_valid_manifest_has_no_problem() -> None:
    assert problems(manifest()) == {}
    check_manifest(manifest())
    events = manifest(function={"on": ["orders.*.created", "jobs.>"], "result_subject": "orders.done"})
    assert problems(events) == {}


@pytest.mark.parametrize(("service", "field"), [
    ({"buffer_replicas": -1}, "buffer_replicas"),
    ({"buffer_replicas": 101}, "buffer_replicas"),
    ({"scaledown_window_s": -5.0}, "scaledown_window_s"),
    ({"scaledown_window_s": math.inf}, "scaledown_window_s"),
    ({"target_p95_ms": 0.0}, "target_p95_ms"),
    ({"target_p95_ms": math.nan}, "target_p95_ms"),
    ({"timeout_s": 0.0}, "timeout_s"),
    ({"timeout_s": math.nan}, "timeout_s"),
    ({"timeout_s": 1e9}, "timeout_s"),
    ({"startup_timeout_s": 0.0}, "startup_timeout_s"),
    ({"startup_timeout_s": math.nan}, "startup_timeout_s"),
    ({"memory_mb": -1}, "memory_mb"),
    ({"gpu_count": 9}, "gpu_count"),
    ({"gpu_count": 1, "gpu": GpuRequest(count=2)}, "gpu_count"),
    ({"gpu_count": 1, "gpu_types": ["a.b"]}, "gpu_types[0]"),
    ({"gpu_count": 1, "gpu_types": ["H100", "H100"]}, "gpu_types"),  # the scheduler's request refuses them: its
    ({"gpu_count": 1, "gpu_types": ["4090"]}, "gpu_types"),  # failure once stopped every app's placement
    ({"min_replicas": -1}, "min_replicas"),
    ({"min_replicas": 100_000, "max_replicas": 100_000}, "min_replicas"),
    ({"min_replicas": 2, "max_replicas": 1}, "max_replicas"),
    ({"min_replicas": 0, "max_replicas": 0}, "max_replicas"),
    ({"name": "not a name"}, "name"),
])
def test_each_bad_service_field_is_named(service: dict[str, Any], field: str) -> None:
    assert f"$.manifest.services[0].{field}" in problems(manifest(service))
    with pytest.raises(InvalidInputError) as info:
        check_manifest(manifest(service))
    assert info.value.field is not None and info.value.field.startswith("$.manifest.services[0]")


@pytest.mark.parametrize("subject", ["_INBOX.>", "ember.invoke.>", "ember.calls.default.x.f", "$JS.API.>", "$KV.x.>",
                                     "$SYS.>", ">", "*.orders", "a..b", "a b", "orders.>.x", "", "x" * 300])
def test_events_may_not_bind_reserved_or_malformed_subjects(subject: str) -> None:
    assert "$.manifest.services[0].functions[0].on[0]" in problems(manifest(function={"on": [subject]}))
    assert subject_problem(subject, wildcards=True)


@pytest.mark.parametrize("subject", ["orders.*", "orders.>", "ember.results", "_INBOX.abc", "$JS.x"])
def test_a_result_subject_has_no_wildcard_and_no_reserved_root(subject: str) -> None:
    m = manifest(function={"on": ["orders.new"], "result_subject": subject})
    assert "$.manifest.services[0].functions[0].result_subject" in problems(m)


def test_a_result_subject_needs_events() -> None:
    assert "$.manifest.services[0].functions[0].result_subject" in problems(manifest(function={"result_subject": "x"}))


@pytest.mark.parametrize(("fields", "field"), [
    ({"app": "apps"}, "$.manifest.app"),
    ({"app": "Hello"}, "$.manifest.app"),
    ({"module": "../evil"}, "$.manifest.module"),
    ({"services": []}, "$.manifest.services"),
])
def test_app_level_fields(fields: dict[str, Any], field: str) -> None:
    assert field in problems(manifest(**fields))


def test_names_are_unique_and_match_their_service() -> None:
    m = manifest()
    twice = msgspec.structs.replace(m, services=[m.services[0], m.services[0]])
    assert "$.manifest.services[1].name" in problems(twice)
    method = FunctionSpec(name="Other.predict", attr="predict", input_mode="single")
    cls = ServiceSpec(name="Model", kind="class", functions=[method])
    assert "$.manifest.services[0].functions[0].name" in problems(msgspec.structs.replace(m, services=[cls]))
    fn = m.services[0].functions[0]
    dup = msgspec.structs.replace(m.services[0], functions=[fn, fn])
    assert "$.manifest.services[0].functions[1].name" in problems(msgspec.structs.replace(m, services=[dup]))


@pytest.mark.parametrize(("low", "high", "field"), [
    (-1, 1, "$.min_replicas"), (MAX_REPLICAS + 1, MAX_REPLICAS + 1, "$.min_replicas"),
    (100_000, 100_000, "$.min_replicas"), (2, 1, "$.max_replicas"), (0, 0, "$.max_replicas"),
    (0, MAX_REPLICAS + 1, "$.max_replicas"),
])
def test_scale_bounds(low: int, high: int, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        check_scale(low, high)
    assert info.value.field == field
    check_scale(0, 1)
    check_scale(MAX_REPLICAS, MAX_REPLICAS)


def test_the_sdk_runs_the_same_validator_before_a_push() -> None:
    app = ember.App("hello")

    @app.function()
    def f(x: int) -> int:
        return x

    app.manifest("hello")  # valid
    with pytest.raises(InvalidSpecError, match=r"\$\.module"):
        app.manifest("../evil")
