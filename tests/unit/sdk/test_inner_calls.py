"""Calls from inside a replica, on the SDK's side: the relay request each verb's request becomes (the deadline and
chain of the call being served go with it), the current call, and ``App(calls=...)``."""

from __future__ import annotations

import asyncio
import math
import time

import msgspec
import pytest

import ember
from ember import _client, _inner
from ember._client import RawBody, cancel_op, invoke_op, record_op, spawn_op
from ember._errors import BadRequestError, DeadlineExceededError, EmberError, InvalidSpecError
from ember.wire.calls import Hop
from ember.wire.relay import RelayCancel, RelayInvoke, RelayRecord, RelaySpawn
from ember.wire.validate import manifest_problems

HOP = Hop(app="x", function="y", call_id="c0")


def _serving(deadline: float = math.inf) -> _inner.CallContext:
    return _inner.CallContext(app="a", function="Model.f", call_id="c1", deadline=deadline, chain=(HOP,))


def test_a_call_carries_the_callers_deadline_and_chain() -> None:
    deadline = time.time() + 30
    request, wait_s = _inner.relay_request(invoke_op("b", "h", b"[1]"), _serving(deadline))
    assert request == RelayInvoke(app="b", function="h", input=msgspec.Raw(b"[1]"), deadline=deadline,
                                  caller_function="Model.f", caller_call_id="c1", chain=[HOP])
    assert 29 < wait_s <= 30


def test_a_timeout_option_shortens_the_deadline_but_never_extends_it() -> None:
    deadline = time.time() + 30
    short, _ = _inner.relay_request(invoke_op("b", "h", b"1", timeout_s=5), _serving(deadline))
    long, _ = _inner.relay_request(invoke_op("b", "h", b"1", timeout_s=500), _serving(deadline))
    assert isinstance(short, RelayInvoke) and short.deadline <= time.time() + 5
    assert isinstance(long, RelayInvoke) and long.deadline == deadline


def test_outside_any_call_there_is_no_deadline_or_chain() -> None:
    request, wait_s = _inner.relay_request(invoke_op("b", "h", b"1"), None)
    assert request == RelayInvoke(app="b", function="h", input=msgspec.Raw(b"1"))
    assert wait_s == _inner.NO_DEADLINE_WAIT_S


def test_a_call_with_no_time_left_is_refused_before_it_is_sent() -> None:
    with pytest.raises(DeadlineExceededError, match="no time is left"):
        _inner.relay_request(invoke_op("b", "h", b"1"), _serving(time.time() - 1))


def test_spawns_records_and_cancels_become_their_relay_requests() -> None:
    spawn, _ = _inner.relay_request(spawn_op("b", "h", b"2", timeout_s=9, idempotency_key="k"), _serving())
    assert spawn == RelaySpawn(app="b", function="h", input=msgspec.Raw(b"2"), timeout_s=9.0, idempotency_key="k",
                           caller_call_ids=["c1"])  # the call its code serves: the control plane checks it
    record, wait_s = _inner.relay_request(record_op("c9", wait_s=12), None)
    assert record == RelayRecord(call_id="c9", wait_s=12.0) and wait_s > 12
    assert _inner.relay_request(cancel_op("c9"), None)[0] == RelayCancel(call_id="c9")
    with pytest.raises(EmberError, match="only calls of functions"):
        _inner.relay_request(_client.dead_letters_op("b", "h"), None)


def test_a_raw_body_cannot_travel_between_functions() -> None:
    with pytest.raises(BadRequestError, match="travel as JSON"):
        _inner.relay_request(invoke_op("b", "h", RawBody(b"\x00\x01")), None)


def test_current_call_is_the_call_being_served() -> None:
    assert ember.current_call() is None
    with _inner.serving(_serving(time.time() + 10)):
        call = ember.current_call()
        assert call is not None and call.chain == (HOP,) and 9 < call.remaining_s() <= 10
    assert ember.current_call() is None


class _Loop:
    """A relay whose event loop is the one running the test: a blocking verb there must be refused."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()

    async def request(self, request: object, wait_s: float) -> object:
        raise AssertionError("never sent")


def test_a_blocking_call_on_the_replicas_event_loop_is_refused() -> None:
    async def blocking() -> None:
        _inner.install(_Loop())  # type: ignore[arg-type]
        try:
            assert isinstance(_client.default_transport(), _inner.RelayTransport)
            with pytest.raises(EmberError, match=r"await the \.aio form"):
                ember.lookup("b", "h").remote(1)
        finally:
            _inner.uninstall()

    asyncio.run(blocking())
    assert not isinstance(_client.default_transport(), _inner.RelayTransport)


def test_an_app_names_the_apps_it_calls() -> None:
    assert ember.App("a", calls=["c", "b", "a"]).calls == ["b", "c"]  # its own is implied
    with pytest.raises(InvalidSpecError, match="calls="):
        ember.App("a", calls=["Not An App"])
    with pytest.raises(InvalidSpecError, match="calls="):
        ember.App("a", calls="b")  # type: ignore[arg-type]


def test_the_manifests_called_apps_are_checked() -> None:
    app = ember.App("a")

    @app.function()
    def f(x: int) -> int:
        return x

    manifest = msgspec.structs.replace(app.manifest("m"), calls=["b", "b", "../x", *[f"a{i}" for i in range(70)]])
    problems = dict(manifest_problems(manifest))
    assert "$.manifest.calls" in problems  # too many
    assert "$.manifest.calls[1]" in problems and "twice" in problems["$.manifest.calls[1]"]
    assert "$.manifest.calls[2]" in problems and "not an app name" in problems["$.manifest.calls[2]"]
