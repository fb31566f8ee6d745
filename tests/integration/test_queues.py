"""Durable queues: spawn, results, idempotency, retries and dead letters, cancellation, deadlines,
and no loss when a replica is killed mid-batch or nats-server restarts."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from support.auth import authed_client
from support.calls import result, spawn
from support.platform import TestPlatform
from support.polling import wait_for

import ember
from ember._client import Transport
from ember._deploy import app_view

pytestmark = pytest.mark.integration




def log_count(transport: Transport, service: str, marker: str, app: str = "probe") -> int:
    lines = transport.json("GET", f"/v1/apps/{app}/logs", params={"service": service, "limit": 5000})
    return sum(marker in line["line"] for line in lines)




def test_spawn_then_get_the_result(probe, http):
    call_id = spawn(http, "work", {"n": 21})
    record = result(http, call_id)
    assert record["status"] == "succeeded" and record["output"] == 42 and record["attempts"] == 1


def test_spawn_validates_before_queueing(probe, http):
    assert http.post("/v1/probe/work/spawn", json={"n": "x"}).status_code == 422
    assert http.post("/v1/probe/nosuch/spawn", json=1).status_code == 404
    assert http.get("/v1/calls/0123456789abcdef").status_code == 404


def test_the_same_idempotency_key_runs_once(probe, http, transport):
    first = http.post("/v1/probe/flaky/spawn", json="idem-1", headers={"Idempotency-Key": "order-77"})
    again = http.post("/v1/probe/flaky/spawn", json="idem-1", headers={"Idempotency-Key": "order-77"})
    assert first.json()["call_id"] == again.json()["call_id"]
    assert first.json()["created"] and not again.json()["created"]
    assert result(http, first.json()["call_id"])["output"] == "idem-1"
    wait_for(lambda: log_count(transport, "flaky", "flaky(idem-1) ran"), what="the run's log line")
    assert log_count(transport, "flaky", "flaky(idem-1) ran") == 1


def test_a_poisoned_input_is_dead_lettered_and_the_queue_keeps_flowing(probe, http, transport):
    poison = spawn(http, "flaky", "poison-1")
    fine = [spawn(http, "flaky", f"fine-{i}") for i in range(3)]
    assert [result(http, c)["output"] for c in fine] == ["fine-0", "fine-1", "fine-2"]
    failed = result(http, poison)
    assert failed["status"] == "failed" and failed["attempts"] == 3  # the first try and max_retries=2
    assert failed["error"]["type"] == "RuntimeError" and "poisoned" in failed["error"]["message"]
    # its letter follows its final record (the record first: a replica never has to take a letter back)
    def letter_of_poison() -> dict | None:
        dead = transport.json("GET", "/v1/apps/probe/dead", params={"function": "flaky"})
        return next((d for d in dead if d["call_id"] == poison), None)

    letter = wait_for(letter_of_poison, timeout_s=30, what="the poisoned call's letter")
    assert letter["input"] == "poison-1" and letter["attempts"] == 3
    replayed = transport.json("POST", "/v1/apps/probe/dead/replay", json={"function": "flaky", "call_ids": [poison]})
    (new_id,) = replayed["replayed"]
    assert result(http, new_id)["status"] == "failed"

    def letters() -> set[str] | None:  # the replay's letter follows its final record, as the first one's did
        dead = {d["call_id"] for d in transport.json("GET", "/v1/apps/probe/dead", params={"function": "flaky"})}
        return dead if new_id in dead else None

    assert poison not in wait_for(letters, timeout_s=30, what="the replayed call's letter")


def test_a_cancelled_queued_call_never_runs(probe, http, transport):
    busy = spawn(http, "slow", 1.5)
    wait_for(lambda: log_count(transport, "slow", "slow(1.5) started"), what="the first call to start")
    queued = spawn(http, "slow", 0.31)
    cancelled = http.delete(f"/v1/calls/{queued}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert http.delete(f"/v1/calls/{queued}").status_code == 409
    assert result(http, busy)["status"] == "succeeded"
    assert http.delete(f"/v1/calls/{busy}").status_code == 409  # finished: too late to cancel
    assert result(http, spawn(http, "slow", 0.01))["status"] == "succeeded"  # queued after: ran after
    assert result(http, queued)["status"] == "cancelled"
    assert log_count(transport, "slow", "slow(0.31) started") == 0


def test_a_call_whose_deadline_passes_in_the_queue_never_runs(probe, http, transport):
    busy = spawn(http, "slow", 1.2)
    late = spawn(http, "slow", 0.32, **{"X-Ember-Timeout": "0.3"})
    assert result(http, busy)["status"] == "succeeded"
    record = result(http, late)
    assert record["status"] == "expired" and record["error"]["code"] == "deadline_exceeded"
    assert log_count(transport, "slow", "slow(0.32) started") == 0


def test_a_call_longer_than_ack_wait_runs_once(probe, http, transport):
    assert float(os.environ["EMBER_ACK_WAIT_S"]) < 4.5
    call_id = spawn(http, "slow", 4.5)
    assert result(http, call_id)["status"] == "succeeded"
    assert log_count(transport, "slow", "slow(4.5) started") == 1


def test_killing_a_replica_mid_batch_loses_no_call(probe, http, transport):
    ids = {n: spawn(http, "work", {"n": 1000 + n}) for n in range(24)}
    wait_for(lambda: log_count(transport, "work", "work(10"), what="a batch to start")
    (victim,) = {r.pid for s in app_view(transport, "probe").services if s.name == "work"
                 for r in s.replicas if r.state == "ready"}
    os.kill(victim, signal.SIGKILL)
    records = {n: result(http, call_id, timeout_s=90) for n, call_id in ids.items()}
    assert all(r["status"] == "succeeded" for r in records.values()), records
    assert {n: r["output"] for n, r in records.items()} == {n: 2 * (1000 + n) for n in range(24)}


def test_nothing_queued_is_lost_when_nats_restarts(tmp_path: Path):
    app_file = tmp_path / "steady.py"
    app_file.write_text('import time\nimport ember\napp = ember.App("steady")\n@app.function()\n'
                        "def double(n: int) -> int:\n    time.sleep(0.05)\n    return 2 * n\n")
    with TestPlatform(tmp_path / "state") as platform, authed_client(platform) as http:
        transport = Transport(platform.url, token=platform.token)
        ember.deploy(app_file, transport=transport, timeout_s=120)
        transport.close()
        ids = {n: spawn(http, "double", n, app="steady") for n in range(40)}
        platform.restart_nats()
        outputs = {n: result(http, call_id, timeout_s=120) for n, call_id in ids.items()}
    assert {n: r["output"] for n, r in outputs.items()} == {n: 2 * n for n in range(40)}


def test_a_large_result_is_stored_whole(probe, http):
    record = result(http, spawn(http, "big", 600))
    assert record["status"] == "succeeded" and record["output"] == "x" * (600 * 1024)


def test_a_replica_that_is_stopped_hands_its_calls_back(probe, http, transport):
    ids = {n: spawn(http, "work", {"n": 5000 + n}) for n in range(24)}
    wait_for(lambda: log_count(transport, "work", "work(50"), what="a batch to start")
    (replica,) = [r for s in app_view(transport, "probe").services if s.name == "work"
                  for r in s.replicas if r.state == "ready"]
    os.kill(replica.pid, signal.SIGTERM)  # drains: finishes what runs, naks what it holds
    records = {n: result(http, call_id, timeout_s=90) for n, call_id in ids.items()}
    assert {n: r["output"] for n, r in records.items()} == {n: 2 * (5000 + n) for n in range(24)}
