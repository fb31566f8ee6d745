"""The gateway's bound on how deep a body nests: measured without recursion, before any decoder recurses into it,
a 400 naming the limit beyond it; bodies within it decode as before (whole-number floats in int fields too)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember._errors import BadRequestError, InvalidInputError
from ember.wire import FunctionSpec
from ember_platform.gateway.body import (
    MAX_DEPTH,
    InputValidator,
    check_depth,
    check_packed_depth,
    decode_json,
    nested_deeper,
)
from ember_platform.gateway.openai_api import parse


def nest(depth: int, inner: bytes = b"") -> bytes:
    return b"[" * depth + inner + b"]" * depth


def depth_of(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(alphabet='[]{}"\\ aé☃')
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=40)


@settings(max_examples=200, deadline=None)
@given(json_values, st.integers(min_value=0, max_value=3))
def test_the_measure_agrees_with_the_decoded_depth(value, extra):
    body = nest(MAX_DEPTH - 2 + extra, msgspec.json.encode(value))  # near the limit: the exact measure decides
    deeper = MAX_DEPTH - 2 + extra + depth_of(value) > MAX_DEPTH
    if deeper:
        with pytest.raises(BadRequestError, match=f"deeper than {MAX_DEPTH} levels"):
            check_depth(body)
    else:
        check_depth(body)
    assert nested_deeper(msgspec.json.decode(body), MAX_DEPTH) is deeper
    packed = msgspec.msgpack.encode(msgspec.json.decode(body))
    if deeper:
        with pytest.raises(BadRequestError, match=f"deeper than {MAX_DEPTH} levels"):
            check_packed_depth(packed)
    else:
        check_packed_depth(packed)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 600, 2000, 200_000])
def test_any_depth_beyond_the_limit_is_a_400(depth):
    for body in (nest(depth), b'{"a":' * depth + b"1" + b"}" * depth):
        with pytest.raises(BadRequestError, match=f"deeper than {MAX_DEPTH} levels"):
            check_depth(body)
        with pytest.raises(BadRequestError, match=f"deeper than {MAX_DEPTH} levels"):
            decode_json(msgspec.json.Decoder(object), body)
    with pytest.raises(BadRequestError, match=f"deeper than {MAX_DEPTH} levels"):
        check_packed_depth(b"\x91" * depth + b"\xc0")


def test_brackets_in_strings_do_not_count():
    check_depth(b'["' + b"[" * 500 + b'", "\\"' + b"{" * 500 + b'"]')
    check_depth('["é☃", '.encode() + nest(MAX_DEPTH - 1) + b"]")


def test_malformed_json_with_many_brackets_is_malformed_not_deep():
    for body in (b"[" * 100, b'["' + b"[" * 100, b"[1,]" + nest(70)):
        with pytest.raises(BadRequestError, match="malformed JSON"):
            check_depth(body)


def test_a_whole_number_float_beside_a_deep_field_is_a_400():
    """It sent the int field's fallback (2.0 as 2) recursing into the deep field: a RecursionError, a 500."""
    body = b'{"model": "m", "prompt": "x", "max_tokens": 2.0, "junk": ' + nest(600) + b"}"
    with pytest.raises(BadRequestError, match=f"deeper than {MAX_DEPTH} levels"):
        parse("completion", body)
    shallow = b'{"model": "m", "prompt": "x", "max_tokens": 2.0, "junk": ' + nest(10) + b"}"
    assert parse("completion", shallow).max_tokens == 2


def test_a_whole_number_float_beside_malformed_json_is_a_400():
    with pytest.raises(BadRequestError, match="malformed JSON"):
        decode_json(msgspec.json.Decoder(dict[str, int]), b'{"a": 2.0, "b": [}')
    with pytest.raises(InvalidInputError):
        decode_json(msgspec.json.Decoder(dict[str, int]), b'{"a": 2.5}')


def test_a_call_input_deeper_than_the_limit_is_a_400():
    validator = InputValidator(FunctionSpec(name="f", attr="f", input_mode="kwargs", input_schema={"type": "object"}))
    validator.check(b'{"a": ' + nest(MAX_DEPTH - 1) + b"}")
    with pytest.raises(BadRequestError, match=f"deeper than {MAX_DEPTH} levels"):
        validator.check(b'{"a": ' + nest(MAX_DEPTH) + b"}")
    with pytest.raises(BadRequestError, match=f"deeper than {MAX_DEPTH} levels"):
        validator.check_packed(b"\x81\xa1a" + b"\x91" * MAX_DEPTH + b"\xc0")
