"""A replica cannot write where it may not through a request's reply subject, nor purge the buckets it writes.

NATS checks a client's permissions on the subjects it publishes to, not on the reply subject of its requests, and
the server (JetStream) or a control plane answers there with its own rights. So a replica reads no store itself
(its queue worker's reads go over the relay), the relay answers only into the asking replica's own inbox, and the
buckets replicas write take no ``Nats-Rollup`` header. A hostile app (tests/apps/intruder, ``steer``) tries each
from its own replica's connection; the victim app's deployment and call record, and the tokens, are untouched.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time

import msgspec
import pytest
from support.natsconn import kv_value
from support.paths import REPO
from support.polling import wait_for

from ember.wire import Deployment, subjects
from ember_runtime.agent.fetch import RESYNC_S

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.usefixtures("collect_refused_sockets"),
]



def test_a_replica_writes_nothing_through_a_reply_subject_and_purges_nothing(platform, http, hello, deployed):
    spawned = http.post("/v1/hello/greet/spawn", json="victim")
    assert spawned.status_code == 202, spawned.text
    call_id = spawned.json()["call_id"]
    wait_for(lambda: http.get(f"/v1/calls/{call_id}").json().get("status") == "succeeded", timeout_s=60,
             what="the victim's call")
    deployed(REPO / "tests" / "apps" / "intruder" / "intruder.py")
    victims_status = asyncio.run(kv_value(platform.nats_url, subjects.CALLS_BUCKET, f"s.hello.{call_id}"))
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(24)
    planted = {"id": token_id, "secret_sha256": hashlib.sha256(secret.encode()).hexdigest()}

    seen = http.post("/v1/intruder/steer", json={"app": "hello", "token": planted, "call_id": call_id},
                     timeout=180).json()

    assert seen["write a token record under its own key"].startswith("no error")  # its own key: allowed
    read = seen["read it back into the tokens"]
    assert "permissions violation" in read.lower(), read  # a replica reads no store, not even its own keys
    # No token was planted: the server stored nothing under the tokens' key, and the token is refused.
    assert asyncio.run(kv_value(platform.nats_url, subjects.TOKENS_BUCKET, token_id)) is None
    assert http.get("/v1/tokens", headers={"Authorization": f"Bearer ember_{token_id}_{secret}"}).status_code == 401

    # The relay did not answer into the victim's deployment: its key still holds a deployment, and the app answers.
    stored = asyncio.run(kv_value(platform.nats_url, subjects.DEPLOYMENTS_BUCKET, "hello"))
    assert stored is not None and msgspec.json.decode(stored, type=Deployment).app == "hello"
    assert http.post("/v1/hello/greet", json="x").json() == "Hello, x!"

    # The relay read nothing of the victim's call for it, and its take wrote under the intruder's own keys alone.
    assert seen["read another app's call over the relay"] == '{"output":null,"error":null}'
    taken = json.loads(seen["take another app's call over the relay"])["output"]
    assert taken["record"]["app"] == "intruder" and taken["finished"] is False
    # A record under its own key naming the victim's call is no record: taken, it is a new one of its own key; read,
    # none; and the victim's status record is as it was.
    planted = json.loads(seen["take its own key naming another app's call"])["output"]["record"]
    assert planted["app"] == "intruder" and planted["call_id"].startswith("planted"), planted
    assert seen["read its own key naming another app's call"] == '{"output":null,"error":null}'
    assert asyncio.run(kv_value(platform.nats_url, subjects.CALLS_BUCKET, f"s.hello.{call_id}")) == victims_status

    # The rollups purged nothing, and the take changed nothing: the victim's record is there, with its output.
    record = http.get(f"/v1/calls/{call_id}")
    assert record.status_code == 200 and record.json()["output"] == "Hello, victim!", record.text
    assert record.json()["status"] == "succeeded" and record.json()["app"] == "hello"

    # A call to an app it may not call is refused alike whether that app exists or not: nothing learnt of it.
    missing, other = seen["call an app that does not exist"], seen["call another app's missing function"]
    assert missing.startswith("ForbiddenError") and missing == other, (missing, other)


def test_a_servers_empty_answer_sent_into_a_deployment_or_an_assignment_removes_nothing(platform, http, hello,
                                                                                           deployed):
    """The answers no permission keeps a replica from having the server send to another bucket's key: "no
    messages", an empty message, stored under another app's deployment and its node's assignment. Neither is read
    as a deletion: the app keeps its replicas and answers, and the next write of its deployment puts one back."""
    deployed(REPO / "tests" / "apps" / "intruder" / "intruder.py")
    seen = http.post("/v1/intruder/spoil", json={"app": "hello"}, timeout=180).json()
    assert all(answer.startswith("no error") for answer in seen.values()), seen  # its own queue: allowed
    time.sleep(RESYNC_S + 2)  # the agent's reaction to the write, and its next read of its assignment
    assert http.get("/v1/apps/hello").status_code == 200
    assert http.post("/v1/hello/greet", json="x").json() == "Hello, x!"
    ready = [r for s in http.get("/v1/apps/hello").json()["services"] for r in s["replicas"] if r["state"] == "ready"]
    assert ready, "hello lost its replicas"

    # The next write of the app's deployment (its scale, here: the same bounds) puts a deployment back.
    service = http.get("/v1/apps/hello").json()["services"][0]
    bounds = {"min_replicas": service["min_replicas"], "max_replicas": service["max_replicas"]}
    scaled = http.post("/v1/apps/hello/scale", json={"service": service["name"], **bounds})
    assert scaled.status_code == 200, scaled.text
    stored = asyncio.run(kv_value(platform.nats_url, subjects.DEPLOYMENTS_BUCKET, "hello"))
    assert stored and msgspec.json.decode(stored, type=Deployment).app == "hello"


def test_a_key_spoiled_through_a_reply_subject_is_written_back(platform, http, deployed):
    """The primitive the permissions cannot stop (see the module's docstring): the server's acknowledgement of the
    replica's own write, stored under a token's and a quota's key. A control plane's mirror kept the good values and
    writes them back, so that a control plane started later reads a token and a quota, not a server's answer (it read
    neither before: the token refused, the quota gone)."""
    made = http.post("/v1/tokens", json={"scopes": ["deploy"], "apps": ["spoil-x*"], "name": "spoiled"})
    assert made.status_code == 201, made.text
    token, token_id = made.json()["token"], made.json()["info"]["id"]
    quota = f"spoil-{secrets.token_hex(4)}"
    assert http.put(f"/v1/quotas/{quota}", json={"apps": "spoil-x*", "rate_per_s": 5}).status_code == 200
    deployed(REPO / "tests" / "apps" / "intruder" / "intruder.py")
    targets = {subjects.TOKENS_BUCKET: token_id, subjects.QUOTAS_BUCKET: quota}

    seen = http.post("/v1/intruder/spoil_with_acks", json=[f"$KV.{bucket}.{key}" for bucket, key in targets.items()],
                     timeout=180).json()
    assert all(said.startswith("no error") for said in seen.values()), seen  # the publish itself is its own

    def whole() -> bool:
        values = {b: asyncio.run(kv_value(platform.nats_url, b, k)) for b, k in targets.items()}
        return all(v is not None and b'"stream"' not in v for v in values.values()) and \
            json.loads(values[subjects.TOKENS_BUCKET] or b"{}")["info"]["id"] == token_id and \
            json.loads(values[subjects.QUOTAS_BUCKET] or b"{}").get("rate_per_s") == 5
    wait_for(whole, timeout_s=30, what="the spoiled token and quota written back")
    assert http.get("/v1/tokens/self", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    http.delete(f"/v1/quotas/{quota}")
    http.delete(f"/v1/tokens/{token_id}")
