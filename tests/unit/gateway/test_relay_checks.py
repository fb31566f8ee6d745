"""The control plane's checks of a call between functions, as pure functions: who may call whom, and the chain the
callee receives (a cycle or a chain too deep refused, a caller's claim about its own function checked)."""

from __future__ import annotations

import re

import msgspec
import pytest
from support.builders import deployment, service_spec, slot

from ember._errors import BadRequestError, CallCycleError
from ember.wire import FunctionSpec, ServiceSpec
from ember.wire.calls import Hop
from ember.wire.relay import MAX_CHAIN, RelayInvoke
from ember_platform.gateway.relay import Caller, Room, _decode, callee_chain

MODEL = ServiceSpec(name="Model", kind="class", functions=[FunctionSpec(name="Model.f", attr="f", input_mode="single"),
                                                          FunctionSpec(name="Model.g", attr="g", input_mode="single")])


def _caller(*, calls: list[str] | None = None) -> Caller:
    dep = deployment(service_spec("s"), MODEL)
    dep = msgspec.structs.replace(dep, manifest=msgspec.structs.replace(dep.manifest, calls=calls or []))
    return Caller(slot("r1", service="Model"), dep)


def _call(**fields: object) -> RelayInvoke:
    return RelayInvoke(app="b", function="h", input=msgspec.Raw(b"1"), caller_function="Model.f",
                       caller_call_id="c1", **fields)  # type: ignore[arg-type]


def test_an_app_may_call_itself_and_the_apps_it_names_only() -> None:
    caller = _caller(calls=["b"])
    assert caller.may_call("a") and caller.may_call("b")
    assert not caller.may_call("c") and not _caller().may_call("b")


def test_the_callee_gets_the_chain_with_the_caller_last() -> None:
    chain = callee_chain(_caller(), _call(chain=[Hop(app="x", function="y", call_id="c0")]), "b", "h")
    assert chain == [Hop(app="x", function="y", call_id="c0"), Hop(app="a", function="Model.f", call_id="c1")]


@pytest.mark.parametrize(("app", "function"), [("a", "Model.f"), ("a", "Model.g"), ("x", "y"), ("x", "y.z")])
def test_a_service_already_in_the_chain_is_refused(app: str, function: str) -> None:
    # Model.g shares Model.f's replicas (one class): a call to it would wait on the replicas its caller holds.
    with pytest.raises(CallCycleError, match=re.escape("call cycle: x.y -> a.Model.f -> ")):
        callee_chain(_caller(), _call(chain=[Hop(app="x", function="y")]), app, function)


def test_another_service_of_the_same_app_is_no_cycle() -> None:
    assert callee_chain(_caller(), _call(), "a", "s")[-1].app == "a"


def test_a_chain_deeper_than_the_limit_is_refused() -> None:
    hops = [Hop(app=f"x{i}", function="f") for i in range(MAX_CHAIN - 1)]
    assert len(callee_chain(_caller(), _call(chain=hops), "b", "h")) == MAX_CHAIN
    with pytest.raises(CallCycleError, match=f"at most {MAX_CHAIN} deep"):
        callee_chain(_caller(), _call(chain=[*hops, Hop(app="z", function="f")]), "b", "h")


def test_a_caller_claiming_a_function_its_replica_does_not_serve_is_refused() -> None:
    with pytest.raises(BadRequestError) as refused:
        callee_chain(_caller(), msgspec.structs.replace(_call(), caller_function="s"), "b", "h")
    assert refused.value.field == "caller_function"


def test_hops_no_platform_could_have_made_are_refused() -> None:
    with pytest.raises(BadRequestError) as refused:
        callee_chain(_caller(), _call(chain=[Hop(app="x" * 1000, function="f")]), "b", "h")
    assert refused.value.field == "chain"


def test_a_call_made_outside_any_call_names_the_service() -> None:
    chain = callee_chain(_caller(), RelayInvoke(app="b", function="h", input=msgspec.Raw(b"1")), "b", "h")
    assert chain == [Hop(app="a", function="Model", call_id="")]


def test_one_apps_calls_and_waits_take_a_share_of_the_relay_never_all_of_it() -> None:
    """Before, one room of 10,000 for every app: one app's replicas long-polling a record they wrote themselves
    took it all, and every other app's relayed calls (its queue workers' takes and reads too) were refused."""
    room = Room(total=10, per_app=4)
    assert [room.take("evil") for _ in range(4)] == [""] * 4
    assert "app 'evil' has 4" in room.take("evil")  # its share is taken
    assert [room.take("victim") for _ in range(4)] == [""] * 4  # another app's are still served
    assert [room.take("third") for _ in range(2)] == ["", ""]
    assert "relays 10 calls" in room.take("fourth")  # the control plane's own limit still holds
    room.give_back("evil")
    assert room.take("fourth") == "" and "app 'evil'" not in room.take("evil")  # room again, one at a time


def test_a_request_nested_too_deeply_is_a_bad_request_not_an_internal_error() -> None:
    deep = b'{"invoke": 1, "input": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with pytest.raises(BadRequestError, match="nested too deeply"):
        _decode(deep)
