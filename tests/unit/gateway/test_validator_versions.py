"""The gateway keeps one input validator per function and version: a canary's calls alternate between versions,
each checked against its own schema, without rebuilding a validator per call."""

from __future__ import annotations

import pytest
from support.builders import deployment, service_spec

from ember._errors import InvalidInputError
from ember.wire import FunctionSpec
from ember_platform.gateway.body import Validators


def _spec(kind: str) -> FunctionSpec:
    return FunctionSpec(name="f", attr="f", input_mode="single", input_schema={"type": kind})


def test_each_version_keeps_its_own_validator() -> None:
    validators = Validators()
    v1, v2 = deployment(service_spec(), version=1), deployment(service_spec(), version=2)
    as_int, as_str = validators.of(v1, _spec("integer")), validators.of(v2, _spec("string"))
    for _ in range(3):  # alternating versions reuse what was built
        assert validators.of(v1, _spec("integer")) is as_int
        assert validators.of(v2, _spec("string")) is as_str
    assert as_int.check(b"3") == b"3" and as_str.check(b'"x"') == b'"x"'
    with pytest.raises(InvalidInputError):
        as_int.check(b'"x"')


def test_only_the_newest_versions_are_kept() -> None:
    validators = Validators()
    built = [validators.of(deployment(service_spec(), version=v), _spec("integer")) for v in range(1, 7)]
    assert validators.of(deployment(service_spec(), version=6), _spec("integer")) is built[-1]
    assert validators.of(deployment(service_spec(), version=1), _spec("integer")) is not built[0]
    assert len(validators._by_function[("a", "f")]) == Validators.KEPT_VERSIONS
