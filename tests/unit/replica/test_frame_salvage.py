"""A frame its decoder cannot take whole (an input nested past the decoder's stack) is still cut into its calls, each
with its input as it came: every call of it gets answered, the deep one with its own error, the others as usual."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.wire import Invocation, encoder, packed_encoder
from ember_runtime.replica.salvage import decode_frame, json_spans, packed_end, packed_spans, salvage

DEEP_JSON = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
DEEP_PACKED = b"\x81\xa1a" + b"\x91" * 100_000 + b"\x90"


def _calls(deep: bytes, shallow: bytes) -> list[Invocation]:
    return [Invocation(call_id="a", function="f", deadline=1.5, input=msgspec.Raw(shallow)),
            Invocation(call_id="b", function="f", deadline=2.5, input=msgspec.Raw(deep), bundles=True,
                       trace={"traceparent": "x"}),
            Invocation(call_id="c", function="g", deadline=3.5, input=msgspec.Raw(shallow), compact=True)]


def _same(got: list[Invocation], sent: list[Invocation]) -> None:
    assert [bytes(c.input) for c in got] == [bytes(c.input) for c in sent]
    assert [msgspec.structs.replace(c, input=msgspec.Raw(b"")) for c in got] == \
           [msgspec.structs.replace(c, input=msgspec.Raw(b"")) for c in sent]


def test_a_json_frame_too_deep_to_decode_keeps_every_call():
    sent = _calls(DEEP_JSON, b'{"s": "[,\\"]{", "n": [1, 2]}')
    frame = encoder.encode(sent)
    with pytest.raises(RecursionError):
        msgspec.json.decode(frame)
    _same(decode_frame(frame, packed=False) or [], sent)


def test_a_msgpack_frame_too_deep_to_decode_keeps_every_call():
    shallow = msgspec.msgpack.encode({"x": [1, -5, 2.5, 2**63, b"\x91\x92", "é", None, True, {"k": [1]},
                                           msgspec.msgpack.Ext(5, b"\x91" * 20), msgspec.msgpack.Ext(1, b"\x92")]})
    sent = _calls(DEEP_PACKED, shallow)
    frame = packed_encoder.encode(sent)
    with pytest.raises(RecursionError):
        msgspec.msgpack.decode(frame)
    _same(decode_frame(frame, packed=True) or [], sent)


@pytest.mark.parametrize(("frame", "packed"), [
    (b'[["a","f",1.0,' + b"[" * 5000, False),  # ends inside a call
    (b"\x91\x94\xa1a\xa1f\xcb" + bytes(8) + b"\x91" * 5000, True),  # ends inside a value
    (b"\x91\x94\xa1a\xa1f\xcb" + bytes(8) + b"\x91" * 5000 + b"\xc1", True),  # a byte msgpack never uses
    (b"not json", False),
])
def test_a_frame_that_is_no_list_of_calls_is_dropped(frame, packed):
    assert decode_frame(frame, packed) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet='[]{},"\\ aé'), lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(alphabet="[]{},:a", max_size=3), inner, max_size=3), max_leaves=20)
calls = st.lists(st.builds(lambda call_id, value, bundles: (call_id, value, bundles), st.text(max_size=5), json_values,
                           st.booleans()), max_size=4)


@settings(max_examples=200, deadline=None)
@given(calls)
def test_cutting_any_frame_gives_back_its_calls(made):
    for packed, encode, values in ((False, encoder.encode, msgspec.json.encode),
                                   (True, packed_encoder.encode, msgspec.msgpack.encode)):
        sent = [Invocation(call_id=call_id, function="f", deadline=1.0, input=msgspec.Raw(values(value)),
                           bundles=bundles) for call_id, value, bundles in made]
        frame = encode(sent)
        _same(salvage(frame, packed), sent)
        spans = packed_spans(frame) if packed else json_spans(frame)
        assert len(spans) == len(sent)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_a_msgpack_values_end_is_found_without_decoding_it(value):
    data = msgspec.msgpack.encode(value)
    assert packed_end(data + b"\xc0", 0) == len(data)
