"""Functions calling functions, against the real platform: from inside a replica, ``other.remote()``, ``.map()``,
``.spawn()`` (and its ``.get()``) and ``.remote.aio()`` reach another app's functions over the replica's NATS
connection, checked by the control plane (its relay subject), never over HTTP; the caller's deadline and the chain
of calls travel with each call; a cycle is refused; and neither a replica nor an HTTP client can get past the
checks (another app's functions, forged chains and deadlines, another replica's relay subject)."""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import httpx
import msgspec
import nats
import pytest
from support.auth import bearer
from support.natsconn import ends_refused
from support.overlap import most_at_once
from support.paths import REPO

from ember._client import Transport
from ember._deploy import deploy
from ember._errors import ForbiddenError
from ember.wire import AppView, subjects
from ember.wire.calls import Hop
from ember.wire.natscreds import read_file, replica_credentials
from ember.wire.relay import RelayCancel, RelayInvoke, RelayRecord, RelayReply, reply_decoder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
APPS = REPO / "tests" / "apps" / "calling"


@pytest.fixture(scope="module")
def apps(deployed) -> dict[str, AppView]:
    return {name: deployed(APPS / f"{name}.py") for name in ("callee", "caller", "private")}


def _replica(view: AppView) -> str:
    return view.services[0].replicas[0].replica_id


def _post(http: httpx.Client, fn: str, body: object, **headers: str) -> httpx.Response:
    return http.post(f"/v1/fn-caller/Caller.{fn}", json=body, headers=headers, timeout=90)


def _gateway_calls(http: httpx.Client, app: str) -> float:
    """Synchronous calls of ``app`` the gateway answered, from ``GET /metrics``."""
    text = http.get("/metrics").text
    assert "ember_requests_total" in text
    return sum(float(m.group(1)) for m in re.finditer(
        rf'^ember_requests_total\{{[^}}]*app="{re.escape(app)}"[^}}]*\}} (\S+)$', text, re.M))


def test_a_function_calls_another_apps_function_over_nats_not_http(apps, http: httpx.Client) -> None:
    callee_before = _gateway_calls(http, "fn-callee")
    answer = _post(http, "relay", 7, **{"X-Ember-Timeout": "20"})
    assert answer.status_code == 200, answer.text
    seen = answer.json()
    assert seen["x"] == 7
    assert seen["chain"] == ["fn-caller.Caller.relay"]  # the callee sees who waits on it
    assert 0 < seen["remaining_s"] <= 20  # the caller's deadline, not the callee's 60 s
    aio = _post(http, "relay_aio", 8)
    assert aio.status_code == 200, aio.text
    assert aio.json()["x"] == 8 and aio.json()["chain"] == ["fn-caller.Caller.relay_aio"]
    items = _post(http, "items", 5)  # a generator function's items (collected: no streaming between functions)
    assert items.status_code == 200 and items.json() == [["fn-caller.Caller.items"], 0, 1, 2, 3, 4], items.text
    fan = _post(http, "fan", list(range(10)))
    assert fan.status_code == 200, fan.text
    assert fan.json() == list(range(10))
    assert _gateway_calls(http, "fn-caller") >= 3
    assert _gateway_calls(http, "fn-callee") == callee_before  # 13 calls of fn-callee, none through the gateway


def test_a_batched_method_calls_for_its_whole_batch(apps, http: httpx.Client) -> None:
    answers = _concurrently(http, "/v1/fn-caller/Caller.batched", list(range(6)))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert [a.json()["x"] for a in answers] == list(range(6))
    assert all(a.json()["chain"] == ["fn-caller.Caller.batched"] for a in answers)
    assert max(a.json()["batch"] for a in answers) > 1  # they ran as batches, and each batch's calls were made


def _concurrently(http: httpx.Client, path: str, bodies: list[object]) -> list[httpx.Response]:
    async def calls() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=str(http.base_url), headers=bearer(_token(http)), timeout=90) as c:
            return await asyncio.gather(*(c.post(path, json=body) for body in bodies))

    return asyncio.run(calls())


def test_calls_waiting_on_other_functions_do_not_hold_up_the_replica(apps, http: httpx.Client) -> None:
    # Eight calls of an async function that each await a 1 s call of another function, on one replica: they wait
    # together on its event loop (one after the other, no two would overlap).
    answers = _concurrently(http, "/v1/fn-caller/in_async", [{"seconds": 1.0}] * 8)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert len({a.json()["call_id"] for a in answers}) == 8 and all(a.json()["ok"] == 1.0 for a in answers)
    assert most_at_once(a.json()["span"] for a in answers) > 1
    # A sync function with four threads: four calls wait on their inner calls at once, off the event loop.
    answers = _concurrently(http, "/v1/fn-caller/in_threads", [1.0] * 4)
    assert all(a.status_code == 200 and a.json()["ok"] == 1.0 for a in answers), [a.text for a in answers]
    assert most_at_once(a.json()["span"] for a in answers) > 1
    # A blocking call on the replica's event loop would stop it: refused, saying what to do instead.
    refused = http.post("/v1/fn-caller/in_async", json={"seconds": 0.1, "blocking": True}, timeout=30).json()
    assert "await the .aio form" in refused["message"], refused


def test_the_callers_deadline_bounds_the_callee(apps, http: httpx.Client, transport: Transport) -> None:
    # A queued call of fn-caller with 3 s to live calls fn-callee.slow(8): the inner call fails at the caller's
    # deadline (not the callee's 60 s), and the caller, told so, answers in time.
    body = {"app_name": "fn-callee", "function": "slow", "arg": 8}
    spawned = http.post("/v1/fn-caller/Caller.attempt/spawn", json=body, headers={"X-Ember-Timeout": "3"})
    assert spawned.status_code == 202, spawned.text
    record = http.get(f"/v1/calls/{spawned.json()['call_id']}", params={"wait": 60}, timeout=90).json()
    assert record["status"] == "succeeded", record
    outcome = record["output"]
    assert outcome["code"] == "deadline_exceeded" and "fn-callee.slow" in outcome["message"], outcome
    assert 1.0 < outcome["waited_s"] < 8, outcome  # cut by the deadline before slow(8) could have answered
    # An option shorter than the caller's deadline bounds it too; a longer one does not extend it.
    short = _post(http, "attempt", {"app_name": "fn-callee", "function": "echo", "arg": 1, "timeout_s": 4})
    assert short.status_code == 200 and 0 < short.json()["ok"]["remaining_s"] <= 4, short.text
    long = _post(http, "attempt", {"app_name": "fn-callee", "function": "echo", "arg": 1, "timeout_s": 500},
                 **{"X-Ember-Timeout": "10"})
    assert long.status_code == 200 and 0 < long.json()["ok"]["remaining_s"] <= 10, long.text


def test_a_cycle_is_refused_with_the_chain_named(apps, http: httpx.Client) -> None:
    cycle = _post(http, "cycle", 1)
    assert cycle.status_code == 200, cycle.text
    outcome = cycle.json()
    assert outcome["type"] == "CallCycleError" and outcome["code"] == "call_cycle", outcome
    assert "fn-caller.Caller.cycle -> fn-callee.back -> fn-caller.Caller.cycle" in outcome["message"]
    itself = _post(http, "itself", 1).json()
    assert itself["code"] == "call_cycle" and "fn-caller.Caller.itself" in itself["message"], itself


def test_an_error_a_function_lets_out_of_a_call_it_made_does_not_run_it_again(apps, http: httpx.Client) -> None:
    # fn-callee.unavailable answers 503; fn-caller lets that error out: its caller (the gateway) must not take it for
    # a replica that never ran the call and send it again (each level would multiply the calls below it).
    key = uuid.uuid4().hex
    answer = _post(http, "passthrough", key)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["type"] == "UnavailableError" and answer.headers.get("retry-after"), answer.text
    assert _post(http, "runs_of", key).json() == 1


def test_a_spawn_from_a_replica_stores_its_result(apps, http: httpx.Client) -> None:
    spawned = _post(http, "spawner", {"x": 5})
    assert spawned.status_code == 200, spawned.text
    call_id = spawned.json()["call_id"]
    record = http.get(f"/v1/calls/{call_id}", params={"wait": 60}, timeout=90).json()
    assert record["status"] == "succeeded" and record["app"] == "fn-callee", record
    assert record["output"]["x"] == 5 and record["output"]["chain"] == []  # a spawned call starts its own chain
    waited = _post(http, "spawner", {"x": 6, "wait": True})  # .get() from inside the replica too
    assert waited.status_code == 200 and waited.json()["result"]["x"] == 6, waited.text


def test_a_replica_may_not_call_an_app_its_app_does_not_name(apps, http: httpx.Client) -> None:
    refused = _post(http, "attempt", {"app_name": "fn-private", "function": "Vault.secret", "arg": 1}).json()
    assert refused["code"] == "forbidden" and "fn-private" in refused["message"], refused
    public = _post(http, "attempt", {"app_name": "fn-private", "function": "Vault.door", "arg": 1}).json()
    assert public["ok"] == "door 1", public  # a public function: anyone may call it, as over HTTP
    invalid = _post(http, "attempt", {"app_name": "fn-callee", "function": "echo", "arg": "not an int"}).json()
    assert invalid["code"] == "invalid_input" and invalid.get("message"), invalid  # the callee's schema, checked
    missing = _post(http, "attempt", {"app_name": "fn-callee", "function": "nope", "arg": 1}).json()
    assert missing["code"] == "not_found", missing


def test_forged_headers_from_http_neither_extend_a_deadline_nor_skip_a_check(apps, http: httpx.Client) -> None:
    forged = {"Ember-Deadline": repr(time.time() + 3600), "Ember-Chain": "fn-callee.echo",
              "Ember-Call-Id": "forged", "X-Ember-Timeout": "2"}
    slow = http.post("/v1/fn-callee/slow", json=6, headers=forged, timeout=30)
    assert slow.status_code == 504, slow.text  # the 2 s asked for, not the hour forged: slow(6) would answer 200
    echo = http.post("/v1/fn-callee/echo", json=1, headers=forged, timeout=30)
    assert echo.status_code == 200 and echo.json()["chain"] == [] and echo.json()["remaining_s"] <= 2, echo.text
    relay = _post(http, "relay", 2, **forged)  # a forged chain naming the callee does not make this a cycle ...
    assert relay.status_code == 200 and relay.json()["chain"] == ["fn-caller.Caller.relay"], relay.text


def _token(http: httpx.Client) -> str:
    return str(http.headers["authorization"]).split(" ", 1)[1]


async def _as_replica(platform, replica_id: str) -> nats.NATS:
    node = read_file(platform.state_dir / "nats-creds" / f"{platform.node_id}.creds")
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(platform.nats_url, error_cb=on_error,
                            **replica_credentials(node, replica_id).connect_options())
    nc.errors = errors  # type: ignore[attr-defined]
    return nc


async def _relay(nc: nats.NATS, replica_id: str, request: object) -> RelayReply:
    data = request if isinstance(request, bytes) else msgspec.json.encode(request)
    msg = await nc.request(subjects.relay(replica_id), data, timeout=20)
    return reply_decoder.decode(msg.data)


async def _refused(nc: nats.NATS, subject: str, data: bytes) -> str:
    """A request the server should refuse: "answered" if an answer came, else the errors the connection was told."""
    refused = await ends_refused(nc.request(subject, data, timeout=20), nc.errors)  # type: ignore[attr-defined]
    return repr(nc.errors) if refused else "answered"  # type: ignore[attr-defined]


def test_a_replicas_own_connection_cannot_get_past_the_relay(platform, apps, http: httpx.Client) -> None:
    caller, private, callee = _replica(apps["caller"]), _replica(apps["private"]), _replica(apps["callee"])
    others = http.post("/v1/fn-private/Vault.secret/spawn", json=3)  # a call of an app fn-caller does not name
    assert others.status_code == 202, others.text
    others_call = others.json()["call_id"]

    async def attacks() -> dict[str, object]:
        nc = await _as_replica(platform, caller)
        try:
            seen: dict[str, object] = {}
            secret = RelayInvoke(app="fn-private", function="Vault.secret", input=msgspec.Raw(b"1"))
            seen["forbidden"] = await _relay(nc, caller, secret)
            seen["not mine"] = await _relay(nc, caller, RelayInvoke(
                app="fn-callee", function="echo", input=msgspec.Raw(b"1"), caller_function="Vault.secret"))
            far = RelayInvoke(app="fn-callee", function="echo", input=msgspec.Raw(b"1"), deadline=time.time() + 1e6,
                              caller_function="Caller.relay", chain=[Hop(app="fn-private", function="Vault.secret")])
            seen["far deadline"] = await _relay(nc, caller, far)
            deep = [Hop(app=f"a{i}", function="f") for i in range(40)]
            seen["deep"] = await _relay(nc, caller, RelayInvoke(app="fn-callee", function="echo",
                                                                input=msgspec.Raw(b"1"), chain=deep))
            seen["garbage"] = await _relay(nc, caller, b"\x00not json")
            seen["bad call id"] = await _relay(nc, caller, RelayRecord(call_id="../../etc"))
            seen["another app's call"] = await _relay(nc, caller, RelayRecord(call_id=others_call))
            seen["cancel another app's call"] = await _relay(nc, caller, RelayCancel(call_id=others_call))
            # another replica's relay subject: the server refuses the publish, nobody answers
            seen["as another replica"] = await _refused(nc, subjects.relay(private), msgspec.json.encode(secret))
            # nor may it call a function's invoke subject itself
            seen["invoke subject"] = await _refused(nc, subjects.invoke("fn-callee", "echo", 1), b"[]")
            return seen
        finally:
            await nc.close()

    seen = asyncio.run(attacks())
    forbidden = seen["forbidden"]
    assert isinstance(forbidden, RelayReply) and forbidden.error is not None
    assert forbidden.error.code == ForbiddenError.code and "fn-private" in forbidden.error.message
    assert seen["not mine"].error.code == "bad_request" and seen["not mine"].error.field == "caller_function"
    far_reply = seen["far deadline"]
    assert far_reply.error is None, far_reply.error
    echoed = msgspec.json.decode(bytes(far_reply.output))
    assert echoed["remaining_s"] <= 60  # capped by the callee's own timeout_s
    assert echoed["chain"] == ["fn-private.Vault.secret", "fn-caller.Caller.relay"]  # its claims, then itself
    assert seen["deep"].error.code == "call_cycle" and "16" in seen["deep"].error.message
    assert seen["garbage"].error.code == "bad_request"
    assert seen["bad call id"].error.code == "bad_request" and seen["bad call id"].error.field == "call_id"
    for what in ("another app's call", "cancel another app's call"):  # as for an unknown call
        assert seen[what].error.code == "not_found" and others_call in seen[what].error.message, what
    assert "permissions violation" in str(seen["as another replica"]).lower()
    assert private.lower() in str(seen["as another replica"]).lower()
    assert "permissions violation" in str(seen["invoke subject"]).lower()
    assert callee  # its replica exists: the refusals above are not for a missing target


def test_a_push_may_name_only_apps_its_token_may_invoke(platform, http: httpx.Client, tmp_path) -> None:
    name = f"fn-sneaky-{uuid.uuid4().hex[:6]}"
    made = http.post("/v1/tokens", json={"scopes": ["deploy", "invoke"], "apps": [name, "fn-callee"],
                                         "name": "sneaky"})
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "sneaky.py"
    path.write_text(f"import ember\napp = ember.App({name!r}, calls=['fn-callee', 'fn-private'])\n\n\n"
                    "@app.function()\ndef f(x: int) -> int:\n    return x\n")
    sneaky = Transport(platform.url, token=token)
    try:
        with pytest.raises(ForbiddenError) as refused:
            deploy(path, transport=sneaky, timeout_s=60)
    finally:
        sneaky.close()
    assert refused.value.field == "$.manifest.calls[1]" and "fn-private" in refused.value.message


def test_no_time_left_is_refused_before_any_call(apps, http: httpx.Client) -> None:
    answer = _post(http, "attempt", {"app_name": "fn-callee", "function": "echo", "arg": 1,
                                     "timeout_s": 1e-9})
    assert answer.status_code == 200, answer.text
    assert answer.json()["code"] == "deadline_exceeded" and answer.json()["waited_s"] < 1, answer.json()
