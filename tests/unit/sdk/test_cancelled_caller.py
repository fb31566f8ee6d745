"""A function whose own call was cancelled makes no more calls, spawned ones included: the SDK refuses them before
they are sent."""

from __future__ import annotations

import math

import pytest

from ember import _inner
from ember._client import invoke_op, spawn_op
from ember._errors import CallCancelledError
from ember.wire.relay import RelayInvoke, RelaySpawn


def test_a_cancelled_call_makes_no_more_calls() -> None:
    caller = _inner.CallContext(app="a", function="Model.f", call_id="c1", deadline=math.inf)
    request, _ = _inner.relay_request(invoke_op("b", "h", b"1"), caller)
    assert isinstance(request, RelayInvoke)
    caller.cancelled.set()
    with pytest.raises(CallCancelledError) as raised:
        _inner.relay_request(invoke_op("b", "h", b"1"), caller)
    assert raised.value.call_id == "c1"


def test_a_cancelled_call_spawns_nothing() -> None:
    caller = _inner.CallContext(app="a", function="Model.f", call_id="c2", deadline=math.inf)
    request, _ = _inner.relay_request(spawn_op("b", "h", b"1"), caller)
    assert isinstance(request, RelaySpawn) and request.caller_call_ids == ["c2"]  # the control plane checks too
    caller.cancelled.set()
    with pytest.raises(CallCancelledError, match=r"no more calls \(of b\.h\)") as raised:
        _inner.relay_request(spawn_op("b", "h", b"1"), caller)
    assert raised.value.call_id == "c2"
