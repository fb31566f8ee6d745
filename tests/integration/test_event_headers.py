"""Event messages whose headers are wrong, or that try to name a call: settled at once (failed, dead-lettered,
acked; never redelivered), never taking over a spawned call, and never mistaken for an event of a stream
that was deleted and created again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator

import httpx
import pytest
from nats.aio.msg import Msg
from support.natsconn import connect as admin_connect
from support.paths import REPO
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy
from ember._errors import EmberError
from ember.wire import natsflush, subjects

pytestmark = pytest.mark.integration
APP_FILE = REPO / "tests" / "apps" / "events" / "tagger.py"
RESULTS = "events.tagger.out"
Event = tuple[object, dict[str, str]]  # (body, headers)


@pytest.fixture(scope="module")
def tagger(transport: Transport) -> Iterator[None]:
    deploy(APP_FILE, transport=transport, timeout_s=120)
    yield
    with contextlib.suppress(EmberError):
        transport.request("DELETE", "/v1/apps/tagger")


def exchange(nats_url: str, events: list[Event], expect: int, timeout_s: float = 30.0) -> list[Msg]:
    """Publish ``events`` to the bound subject; the first ``expect`` messages on the result subject."""

    async def run() -> list[Msg]:
        nc = await admin_connect(nats_url)
        results: asyncio.Queue[Msg] = asyncio.Queue()
        await nc.subscribe(RESULTS, cb=results.put)
        await natsflush.flush(nc)
        js = nc.jetstream()
        try:
            for body, headers in events:
                await js.publish("events.tagger.in.test", json.dumps(body).encode(), headers=headers or None)
            got: list[Msg] = []
            with contextlib.suppress(TimeoutError):
                while len(got) < expect:
                    got.append(await asyncio.wait_for(results.get(), timeout_s))
            assert len(got) == expect, f"{len(got)} of {expect} results came: " + ", ".join(
                f"{m.headers} {m.data[:80]!r}" for m in got)
            return got
        finally:
            await nc.close()

    return asyncio.run(run())


def pending_events(nats_url: str) -> int:
    async def run() -> int:
        nc = await admin_connect(nats_url)
        try:
            info = await nc.jetstream().stream_info(subjects.events_stream("tagger", "tag"))
            return info.state.messages
        finally:
            await nc.close()

    return asyncio.run(run())


def ran(transport: Transport, tag: str) -> int:
    lines = transport.json("GET", "/v1/apps/tagger/logs", params={"service": "tag", "limit": 5000})
    return sum(f"tag({tag}) ran" in line["line"] for line in lines)


def final_record(http: httpx.Client, call_id: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = http.get(f"/v1/calls/{call_id}", params={"wait": 5}).json()
        if record["status"] in {"succeeded", "failed", "cancelled", "expired"}:
            return record
    raise AssertionError(f"call {call_id} did not finish: {record}")


BAD: dict[str, tuple[dict[str, str], str]] = {  # tag: (headers, the header named in the error)
    "deadline-word": ({"Ember-Deadline": "soon"}, "Ember-Deadline"),
    "deadline-nan": ({"Ember-Deadline": "nan"}, "Ember-Deadline"),
    "deadline-inf": ({"Ember-Deadline": "inf", "Nats-Msg-Id": "fine-id-1"}, "Ember-Deadline"),
    "id-space": ({"Nats-Msg-Id": "two words"}, "Nats-Msg-Id"),
    "id-wildcard": ({"Nats-Msg-Id": "orders.>"}, "Nats-Msg-Id"),
    "id-star": ({"Nats-Msg-Id": "*"}, "Nats-Msg-Id"),
    "id-long": ({"Nats-Msg-Id": "x" * 500}, "Nats-Msg-Id"),
    "reply-wildcard": ({"Ember-Reply-To": "tagger.>"}, "Ember-Reply-To"),
    "reply-reserved": ({"Ember-Reply-To": "$JS.API.STREAM.LIST"}, "Ember-Reply-To"),
}


def test_an_event_with_bad_headers_is_failed_at_once_and_dead_lettered(tagger, platform, http, transport):
    events: list[Event] = [({"tag": tag}, headers) for tag, (headers, _) in BAD.items()]
    got = exchange(platform.nats_url, [*events, ({"tag": "after-the-bad-ones"}, {})], expect=len(BAD) + 1)
    statuses = {m.headers["Ember-Call-Id"]: m.headers["Ember-Status"] for m in got}
    fine = next(m for m in got if m.headers["Ember-Status"] == "succeeded")
    assert json.loads(fine.data) == "after-the-bad-ones"  # the queue keeps flowing
    assert sorted(statuses.values()) == ["failed"] * len(BAD) + ["succeeded"]
    letters = {d["input"]["tag"]: d for d in transport.json("GET", "/v1/apps/tagger/dead", params={"function": "tag"})}
    for tag, (_, header) in BAD.items():
        letter = letters[tag]  # dead-lettered with its input
        assert statuses[letter["call_id"]] == "failed"
        assert letter["error"]["code"] == "invalid_input" and header in letter["error"]["message"], letter
        assert letter["attempts"] == 1
        record = http.get(f"/v1/calls/{letter['call_id']}").json()
        assert record["status"] == "failed" and header in record["error"]["message"]
        assert ran(transport, tag) == 0
    wait_for(lambda: pending_events(platform.nats_url) == 0, timeout_s=30, what="every event to be acked")


def test_an_event_cannot_name_a_spawned_call(tagger, probe, platform, http, transport):
    busy = http.post("/v1/probe/slow/spawn", json=2.1).json()["call_id"]
    wait_for(lambda: any("slow(2.1) started" in line["line"] for line in transport.json(
        "GET", "/v1/apps/probe/logs", params={"service": "slow", "limit": 5000})), what="the busy call to start")
    victim = http.post("/v1/probe/slow/spawn", json=0.37).json()["call_id"]  # queued behind the busy one
    got = exchange(platform.nats_url, [({"tag": "by-call-id"}, {"Ember-Call-Id": victim}),
                                       ({"tag": "by-msg-id"}, {"Nats-Msg-Id": victim})], expect=2)
    assert sorted(json.loads(m.data) for m in got) == ["by-call-id", "by-msg-id"]  # each ran, as its own call
    assert victim not in {m.headers["Ember-Call-Id"] for m in got}
    record = final_record(http, victim)
    assert (record["status"], record["output"], record["app"], record["function"]) == ("succeeded", 0.37, "probe",
                                                                                       "slow")
    assert final_record(http, busy)["output"] == 2.1


def test_default_event_ids_are_new_after_the_stream_is_created_again(tagger, platform, http, transport):
    def redeploy() -> None:
        transport.request("DELETE", "/v1/apps/tagger")
        deploy(APP_FILE, transport=transport, timeout_s=120)

    redeploy()  # the stream starts at sequence 1
    (before,) = exchange(platform.nats_url, [({"tag": "before-redeploy"}, {})], expect=1)
    assert json.loads(before.data) == "before-redeploy"
    redeploy()  # and starts again at 1: the new event must not pass for the finished one
    (after,) = exchange(platform.nats_url, [({"tag": "after-redeploy"}, {})], expect=1)
    assert json.loads(after.data) == "after-redeploy"
    assert after.headers["Ember-Call-Id"] != before.headers["Ember-Call-Id"]
    record = final_record(http, after.headers["Ember-Call-Id"])
    assert record["status"] == "succeeded" and record["output"] == "after-redeploy"
