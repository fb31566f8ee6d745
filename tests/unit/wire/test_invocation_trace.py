"""An ``Invocation`` carries its call's trace context at its end: empty (a few bytes) when untraced, and frames from
either side of the change still decode."""

from __future__ import annotations

import msgspec

from ember.wire import Invocation, invocations_decoder, packed_invocations_decoder


class Before(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """``Invocation`` as it was before the trace context (its fields, in order)."""

    call_id: str
    function: str
    deadline: float
    input: msgspec.Raw = msgspec.Raw(b"null")
    compact: bool = False
    chain: list[object] = []


def test_the_trace_context_travels_in_json_and_msgpack_frames() -> None:
    trace = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "v=1"}
    call = Invocation(call_id="c1", function="f", deadline=1.5, input=msgspec.Raw(b"[1]"), trace=trace)
    assert invocations_decoder.decode(msgspec.json.encode([call]))[0].trace == trace
    packed = Invocation(call_id="c1", function="f", deadline=1.5, input=msgspec.Raw(msgspec.msgpack.encode([1])),
                        trace=trace)
    assert packed_invocations_decoder.decode(msgspec.msgpack.encode([packed]))[0].trace == trace


def test_untraced_it_costs_three_bytes_and_older_frames_decode_with_none() -> None:
    before = Before(call_id="c1", function="f", deadline=1.5, input=msgspec.Raw(b"[1]"))
    now = Invocation(call_id="c1", function="f", deadline=1.5, input=msgspec.Raw(b"[1]"))
    # ,{} for the trace context; ,false for ``bundles`` (added after it: a stream's caller that reads bundles)
    assert len(msgspec.json.encode(now)) - len(msgspec.json.encode(before)) == 3 + 6
    assert invocations_decoder.decode(msgspec.json.encode([before]))[0].trace == {}
    assert msgspec.json.decode(msgspec.json.encode(now), type=Before).call_id == "c1"  # an older replica reads it
