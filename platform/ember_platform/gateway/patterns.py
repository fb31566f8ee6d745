"""Schema patterns matched in linear time.

A function's input schema may carry ``pattern`` (``msgspec.Meta(pattern=...)``) or ``patternProperties``: the
gateway matches them against every caller's input, on its event loop, before any replica sees the call. With
Python's backtracking ``re`` a pattern such as ``^(a+)+$`` takes exponential time on a short hostile string and
stalls every call of every app. RE2 guarantees time linear in the input; the patterns it cannot run
(backreferences, lookaround) are refused when the app is deployed, naming the field.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import re2
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

MAX_PATTERN = 1000  # characters


@lru_cache(maxsize=1024)
def compiled(pattern: str) -> Any:
    return re2.compile(pattern)


def pattern_problem(pattern: Any) -> str:
    """Why ``pattern`` cannot be matched safely by the gateway; "" when it can."""
    if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN:
        return f"a pattern is a string of at most {MAX_PATTERN} characters"
    try:
        compiled(pattern)
    except re2.error as exc:
        return f"pattern {pattern!r} is not one the gateway can match in linear time (RE2: {exc})"
    return ""


def schema_patterns(node: Any, path: str) -> Iterator[tuple[str, str]]:
    """``(JSON path, problem)`` for every pattern in a JSON Schema that ``pattern_problem`` refuses."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern":
                problem = pattern_problem(value)
                if problem:
                    yield f"{path}.pattern", problem
            elif key == "patternProperties" and isinstance(value, dict):
                for pattern in value:
                    problem = pattern_problem(pattern)
                    if problem:
                        yield f"{path}.patternProperties", problem
            if key != "enum" and key != "const":
                yield from schema_patterns(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from schema_patterns(item, f"{path}[{i}]")


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not compiled(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any,
                        schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = compiled(pattern)
        for key, value in instance.items():
            if regex.search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


SafeValidator = validators.extend(Draft202012Validator, {"pattern": _pattern, "patternProperties": _pattern_properties})
