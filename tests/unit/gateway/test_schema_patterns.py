"""Schema patterns are matched by RE2 in the gateway: linear in the input, whatever the pattern."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest

from ember._errors import InvalidInputError
from ember.wire import FunctionSpec
from ember_platform.gateway.body import InputValidator
from ember_platform.gateway.patterns import pattern_problem, schema_patterns
from ember_platform.gateway.schema import decoder_for

EVIL = "^(a+)+$"  # exponential for a backtracking matcher on "aaaa...b"


def validator(schema: dict) -> InputValidator:
    return InputValidator(FunctionSpec(name="f", attr="f", input_mode="single", input_schema=schema))


def test_a_catastrophic_pattern_answers_at_once() -> None:
    # With Python's re this call would not return before the test's timeout (2**50000 steps).
    check = validator({"type": "string", "pattern": EVIL})
    with pytest.raises(InvalidInputError) as info:
        check.check(msgspec.json.encode("a" * 50_000 + "b"))
    assert info.value.field == "$"
    assert check.check(b'"aaaa"') == b'"aaaa"'


def test_patterns_from_msgspec_types_are_enforced_the_same() -> None:
    class Order(msgspec.Struct):
        sku: Annotated[str, msgspec.Meta(pattern="^[A-Z]{3}-[0-9]+$")]
        tags: dict[Annotated[str, msgspec.Meta(pattern="^t")], int] = {}

    (schema,), components = msgspec.json.schema_components([Order], ref_template="#/$defs/{name}")
    schema = {**schema, "$defs": components}
    assert decoder_for(schema) is None  # a pattern takes the generic path, with RE2
    check = validator(schema)
    assert check.check(b'{"sku": "ABC-12"}')
    with pytest.raises(InvalidInputError) as info:
        check.check(b'{"sku": "abc-12"}')
    assert info.value.field == "$.sku"


def test_pattern_properties_use_re2_too() -> None:
    check = validator({"type": "object", "patternProperties": {EVIL: {"type": "integer"}}})
    with pytest.raises(InvalidInputError):
        check.check(msgspec.json.encode({"a" * 20: "not an int"}))
    assert check.check(msgspec.json.encode({"a" * 50_000 + "b": "ignored: the key does not match"}))


@pytest.mark.parametrize("pattern", ["(a)\\1", "(?=a)b", "(?<!x)y", "x" * 2000, 5])
def test_patterns_re2_cannot_run_are_refused_at_deploy(pattern: object) -> None:
    assert pattern_problem(pattern)
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
    assert [field for field, _ in schema_patterns(schema, "$.in")] == ["$.in.properties.s.pattern"]


def test_safe_patterns_pass_and_enums_are_not_mistaken_for_schemas() -> None:
    assert pattern_problem(EVIL) == "" and pattern_problem("^[a-z]+$") == ""
    schema = {"enum": [{"pattern": "(a)\\1"}], "properties": {"x": {"pattern": "^ok$"}}}
    assert list(schema_patterns(schema, "$")) == []
