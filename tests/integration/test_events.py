"""Functions bound to NATS subjects: a plain publish (no Ember SDK) is an invocation; its result is
published to the message's Ember-Reply-To (a reply subject of the app) or the function's result_subject."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from support.natsconn import connect as admin_connect

import ember
from ember.wire import natsflush

pytestmark = pytest.mark.integration

APP = '''import ember
app = ember.App("eventful")

@app.function(on="events.eventful.images.>", result_subject="events.eventful.results", retries=0)
def measure(image: dict) -> int:
    if image.get("poison"):
        raise ValueError("unreadable image")
    return len(image["pixels"])
'''


def test_a_plain_nats_publish_invokes_the_function(tmp_path, platform, transport):
    app_file = tmp_path / "eventful.py"
    app_file.write_text(APP)
    ember.deploy(app_file, transport=transport, timeout_s=120)

    async def exchange() -> tuple[list, list]:
        nc = await admin_connect(platform.nats_url)
        results: asyncio.Queue = asyncio.Queue()
        mine: asyncio.Queue = asyncio.Queue()
        await nc.subscribe("events.eventful.results", cb=results.put)
        inbox = f"_EMBER.replies.eventful.{uuid.uuid4().hex}"  # a requester waits for its own result under the app
        await nc.subscribe(inbox, cb=mine.put)
        await natsflush.flush(nc)
        js = nc.jetstream()
        first = await js.publish("events.eventful.images.cats", json.dumps({"pixels": [1, 2, 3]}).encode(),
                                 headers={"Nats-Msg-Id": "img-1"})
        retried = await js.publish("events.eventful.images.cats", json.dumps({"pixels": [1, 2, 3]}).encode(),
                                   headers={"Nats-Msg-Id": "img-1"})
        assert not first.duplicate and retried.duplicate  # a retried publish is stored, and runs, once
        await nc.publish("events.eventful.images.dogs", json.dumps({"pixels": [9] * 5}).encode(),
                         headers={"Ember-Reply-To": inbox})  # core NATS publish, captured too
        await js.publish("events.eventful.images.bad", json.dumps({"poison": True}).encode(),
                         headers={"Nats-Msg-Id": "img-3"})
        got = [await asyncio.wait_for(results.get(), 60) for _ in range(2)]
        own = [await asyncio.wait_for(mine.get(), 60)]
        await nc.close()
        return got, own

    got, own = asyncio.run(exchange())
    # An event's call id is its Nats-Msg-Id within the function's namespace: ev-<scope>-<Nats-Msg-Id>.
    by_id = {m.headers["Ember-Call-Id"].split("-", 2)[2]: m for m in got}
    assert json.loads(by_id["img-1"].data) == 3 and by_id["img-1"].headers["Ember-Status"] == "succeeded"
    failed = by_id["img-3"]
    assert failed.headers["Ember-Status"] == "failed" and json.loads(failed.data)["type"] == "ValueError"
    assert json.loads(own[0].data) == 5
    first_id = by_id["img-1"].headers["Ember-Call-Id"]
    assert first_id.startswith("ev-")  # never a spawned call's id, nor another function's event's
    record = transport.json("GET", f"/v1/calls/{first_id}")
    assert record["status"] == "succeeded" and record["output"] == 3
    transport.request("DELETE", "/v1/apps/eventful")
