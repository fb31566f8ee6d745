"""Queued calls whose runs end in the codes the platform also uses for its own refusals, and a drain while a queued
call runs: a replica sends a call back to the queue, no retry spent, only when it could not run it. An ``unavailable``
or ``deadline_exceeded`` that the function raised, or let out of a call it made, is its own error, under its
``retries``; and a call whose replica drains (SIGTERM) while it runs, longer than AckWait, runs once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest
from support.calls import result, spawn
from support.natsconn import connect as admin_connect
from support.paths import REPO
from support.polling import wait_for

import ember
from ember._client import Transport
from ember._deploy import app_view, deploy
from ember._errors import EmberError
from ember.wire import subjects
from ember.wire.jetstream import DUPLICATE_WINDOW_S

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
APPS = REPO / "tests" / "apps" / "spawned"
APP = "spawned-errors"


@pytest.fixture(scope="module")
def spawned(transport: Transport) -> Iterator[None]:
    deploy(APPS / "never_ready.py", transport=transport, wait=False)  # its setup never ends
    deploy(APPS / "spawned_errors.py", transport=transport, timeout_s=180)
    yield
    for app in (APP, "never-ready"):
        with contextlib.suppress(EmberError):
            transport.request("DELETE", f"/v1/apps/{app}")




def _logged(transport: Transport, service: str, marker: str) -> int:
    lines = transport.json("GET", f"/v1/apps/{APP}/logs", params={"service": service, "limit": 5000})
    return sum(marker in line["line"] for line in lines)


def _letter(transport: Transport, function: str, call_id: str) -> dict | None:
    dead = transport.json("GET", f"/v1/apps/{APP}/dead", params={"function": function})
    return next((d for d in dead if d["call_id"] == call_id), None)


def test_an_unavailable_a_spawned_call_lets_out_of_its_call_is_its_own_error(spawned, ember_url, http, transport):
    key = uuid.uuid4().hex[:12]
    call = ember.lookup(APP, "via_unready").spawn(key)
    with pytest.raises(ember.UnavailableError) as raised:
        call.get(timeout=90)
    assert "never-ready" in str(raised.value) and "became ready" in str(raised.value), raised.value
    record = result(http, call.call_id)
    assert record["status"] == "failed" and record["attempts"] == 1, record  # retries=0: not run again
    assert record["error"]["code"] == "unavailable" and record["error"]["type"] == "UnavailableError", record
    wait_for(lambda: _logged(transport, "via_unready", f"via_unready({key}) ran"), what="its run's log line")
    assert _logged(transport, "via_unready", f"via_unready({key}) ran") == 1
    letter = wait_for(lambda: _letter(transport, "via_unready", call.call_id), what="its dead letter")
    assert letter["error"]["code"] == "unavailable" and letter["input"] == key, letter


def test_an_unavailable_the_function_raises_is_retried_as_its_retries_say(spawned, http, transport):
    key = uuid.uuid4().hex[:12]
    record = result(http, spawn(http, "refuses", app=APP, body=key))
    assert record["status"] == "failed" and record["attempts"] == 2, record  # the first try and max_retries=1
    assert record["error"]["code"] == "unavailable" and "store is down" in record["error"]["message"], record
    wait_for(lambda: _logged(transport, "refuses", f"refuses({key}) ran") >= 2, what="both runs' log lines")
    assert _logged(transport, "refuses", f"refuses({key}) ran") == 2


def test_a_deadline_of_a_call_it_made_fails_the_spawned_call_not_expires_it(spawned, http, transport):
    key = uuid.uuid4().hex[:12]
    record = result(http, spawn(http, "via_slow", app=APP, body=key))
    assert record["status"] == "failed" and record["attempts"] == 1, record  # its own deadline is 30 s away
    assert record["error"]["code"] == "deadline_exceeded" and "nap" in record["error"]["message"], record
    wait_for(lambda: _logged(transport, "via_slow", f"via_slow({key}) ran"), what="its run's log line")
    assert _logged(transport, "via_slow", f"via_slow({key}) ran") == 1


def test_a_call_whose_replica_drains_while_it_runs_runs_once(spawned, http, transport):
    ack_wait = float(os.environ["EMBER_ACK_WAIT_S"])
    seconds = 2 * ack_wait + 2  # it runs on past a whole AckWait after the SIGTERM, well within the drain's grace
    key = uuid.uuid4().hex[:12]
    call_id = spawn(http, "linger", app=APP, body={"key": key, "seconds": seconds})
    wait_for(lambda: _logged(transport, "linger", f"linger({key}) started"), what="the call to start")
    holder = http.get(f"/v1/calls/{call_id}").json()["replica"]
    (pid,) = [r.pid for s in app_view(transport, APP).services if s.name == "linger" for r in s.replicas
              if r.replica_id == holder]
    os.kill(pid, signal.SIGTERM)  # drains: finishes what it holds; the other replica pulls on meanwhile
    record = result(http, call_id)
    assert record["status"] == "succeeded" and record["output"] == key and record["attempts"] == 1, record
    wait_for(lambda: _logged(transport, "linger", f"linger({key}) ended"), what="the run's last log line")
    assert _logged(transport, "linger", f"linger({key}) started") == 1  # never redelivered to the other replica


@contextlib.contextmanager
def _duplicate_window(url: str, seconds: float) -> Iterator[None]:
    """The calls stream's duplicate window, made ``seconds`` long meanwhile: what 120 s of waiting would show."""
    async def set_window(value: float) -> None:
        nc = await admin_connect(url)
        try:
            js = nc.jetstream()
            config = (await js.stream_info(subjects.CALLS_STREAM)).config
            await js.update_stream(config.evolve(duplicate_window=value))
        finally:
            await nc.close()

    asyncio.run(set_window(seconds))
    try:
        yield
    finally:
        asyncio.run(set_window(DUPLICATE_WINDOW_S))


def test_a_call_spawned_again_with_its_key_past_the_duplicate_window_while_it_runs_runs_once(spawned, http,
                                                                                               transport, platform):
    wait_for(lambda: sum(r.state == "ready" for s in app_view(transport, APP).services if s.name == "linger"
                         for r in s.replicas) >= 2, what="both replicas of linger")  # one idle, to take a second
    key = uuid.uuid4().hex[:12]
    body, headers = {"key": key, "seconds": 6}, {"Idempotency-Key": f"again-{key}"}
    with _duplicate_window(platform.nats_url, 1.0):
        first = http.post(f"/v1/{APP}/linger/spawn", json=body, headers=headers)
        assert first.status_code == 202, first.text
        wait_for(lambda: _logged(transport, "linger", f"linger({key}) started"), what="the call to start")
        time.sleep(2)  # past the window: a message published again now is stored beside the first
        again = http.post(f"/v1/{APP}/linger/spawn", json=body, headers=headers)
        assert again.status_code == 202 and again.json()["call_id"] == first.json()["call_id"], again.text
        record = result(http, first.json()["call_id"])
    assert record["status"] == "succeeded" and record["output"] == key, record
    wait_for(lambda: _logged(transport, "linger", f"linger({key}) ended"), what="the run's last log line")
    time.sleep(2)  # a second message would have been taken by the idle replica at once
    assert _logged(transport, "linger", f"linger({key}) started") == 1
