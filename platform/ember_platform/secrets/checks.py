"""What a secret may be: pure checks of its name and values (422 naming the field, 413 when too large)."""

from __future__ import annotations

from ember._errors import InvalidInputError, PayloadTooLargeError
from ember.wire.secrets import MAX_SECRET_BYTES, MAX_SECRET_KEYS, key_problem, name_problem


def check_name(name: str, field: str = "$.name") -> str:
    problem = name_problem(name)
    if problem:
        raise InvalidInputError(problem, field=field)
    return name


def check_values(values: dict[str, str]) -> dict[str, str]:
    """``values`` if every key is an environment variable a secret may set and they fit; else the error."""
    if not values:
        raise InvalidInputError("a secret holds at least one KEY=VALUE", field="$.values")
    if len(values) > MAX_SECRET_KEYS:
        raise PayloadTooLargeError(f"a secret holds at most {MAX_SECRET_KEYS} keys, not {len(values)}")
    for key, value in values.items():
        problem = key_problem(key)
        if problem:
            raise InvalidInputError(problem, field=f"$.values.{key[:130]}")
        if "\x00" in value:
            raise InvalidInputError(f"the value of {key} holds a NUL character, which no environment variable can",
                                    field=f"$.values.{key}")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in values.items())
    if size > MAX_SECRET_BYTES:
        raise PayloadTooLargeError(f"a secret's keys and values hold at most {MAX_SECRET_BYTES} bytes, not {size}")
    return values
