"""``POST /v1/events/<subject>``'s ``Idempotency-Key`` becomes the event's ``Nats-Msg-Id``, and so its call id: the
gateway takes only a key a replica takes (letters, digits, ``-`` and ``_``), and refuses any other with a 422 that
names the header, over HTTP and through ``ember events publish --id``, rather than answer 202 "stored" for an event
that a replica then fails unrun."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator

import pytest
from support.paths import REPO

from ember._client import Transport
from ember._deploy import deploy
from ember._errors import EmberError
from ember.wire import subjects
from ember_runtime.replica.event_headers import event_scope

pytestmark = pytest.mark.integration
SUBJECT = "events.tagger.in.keys"


@pytest.fixture(scope="module")
def tagger(transport: Transport) -> Iterator[None]:
    deploy(REPO / "tests" / "apps" / "events" / "tagger.py", transport=transport, timeout_s=120)
    yield
    with contextlib.suppress(EmberError):
        transport.request("DELETE", "/v1/apps/tagger")


@pytest.mark.parametrize("key", ["order:77", "a.b", "2024-06-01T10:00:00Z", "two words", "orders.>", "caf\u00e9"])
def test_a_key_no_replica_takes_for_a_call_id_is_refused(tagger, http, key):
    answer = http.post(f"/v1/events/{SUBJECT}", content=b'{"tag": "refused"}',
                       headers={"Idempotency-Key": key.encode("latin-1")})
    assert answer.status_code == 422, (key, answer.status_code, answer.text)
    error = answer.json()["error"]
    assert error["field"] == "Idempotency-Key", error
    assert "letters, digits, '-' or '_'" in error["message"] and "Nats-Msg-Id" in error["message"], error


def test_ember_events_publish_refuses_such_a_key_and_runs_the_event_under_a_good_one(tagger, platform, http,
                                                                                      ember_cli):
    refused = ember_cli("events", "publish", SUBJECT, "--data", '{"tag": "cli"}', "--id", "order:77",
                        url=platform.url, check=False)
    assert refused.returncode == 1 and "Idempotency-Key" in refused.stderr, refused.stderr
    assert "letters, digits" in refused.stderr, refused.stderr
    key = f"order-77_{uuid.uuid4().hex}"
    tag = f"kept-{key[-8:]}"
    for _ in range(2):  # a retried publish is stored, and runs, once
        ember_cli("events", "publish", SUBJECT, "--data", json.dumps({"tag": tag}), "--id", key, url=platform.url)
    call_id = f"ev-{event_scope(subjects.events_stream('tagger', 'tag'))}-{key}"
    record = http.get(f"/v1/calls/{call_id}", params={"wait": 30}, timeout=60).json()
    assert record["status"] == "succeeded" and record["output"] == tag and record["attempts"] == 1, record
