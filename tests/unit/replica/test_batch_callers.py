"""A call a batch makes names every call the batch serves, so that the control plane ends it only once all of them
are cancelled; a relay request naming more than a batch can hold is refused."""

from __future__ import annotations

import time

import msgspec
import pytest

from ember import _inner
from ember._client import invoke_op
from ember._errors import BadRequestError
from ember.wire import encoder
from ember.wire.relay import MAX_CALLER_ID, MAX_CALLERS, RelayInvoke
from ember_platform.gateway.relay import _decode
from ember_runtime.batching.call import Call
from ember_runtime.replica.calling import batch_context


async def _answer(*_: object) -> None:
    pass


def _batch(*call_ids: str) -> list[Call]:
    return [Call(value=i, deadline=time.time() + 60, answer=_answer, call_id=c) for i, c in enumerate(call_ids)]


def test_a_batchs_call_names_every_call_it_serves() -> None:
    context = _inner.CallContext(app="a", function="f", call_id="x", deadline=time.time() + 60, call_ids=("x", "y"))
    request, _ = _inner.relay_request(invoke_op("b", "g", b"1"), context)
    assert isinstance(request, RelayInvoke)
    assert (request.caller_call_id, request.caller_call_ids) == ("x", ["x", "y"])


def test_the_batch_context_holds_every_call_of_the_batch() -> None:
    assert batch_context("a", "f", _batch("x", "y")).call_ids == ("x", "y")


def test_a_single_calls_request_names_it_alone() -> None:
    context = _inner.CallContext(app="a", function="f", call_id="x", deadline=time.time() + 60, call_ids=("x",))
    request, _ = _inner.relay_request(invoke_op("b", "g", b"1"), context)
    assert isinstance(request, RelayInvoke) and request.caller_call_ids == []


@pytest.mark.parametrize("call_ids", [[f"c{i}" for i in range(MAX_CALLERS + 1)], ["c" * (MAX_CALLER_ID + 1)]])
def test_more_callers_than_a_batch_holds_are_refused(call_ids: list[str]) -> None:
    fine = RelayInvoke(app="b", function="g", input=msgspec.Raw(b"1"), caller_call_id="c0", caller_call_ids=["c0"])
    assert _decode(encoder.encode(fine)) == fine
    with pytest.raises(BadRequestError, match="caller_call_ids"):
        _decode(encoder.encode(msgspec.structs.replace(fine, caller_call_ids=call_ids)))
