"""A message a JetStream consumer delivers to a reply subject of the puller's choosing reaches no subscription of
Ember's: each drops what arrives with a subject its own does not match (``subjects.only_on``).

NATS checks no permission on a reply subject, so a replica may pull from its own queue
(``$JS.API.CONSUMER.MSG.NEXT``, which its permissions allow) naming another replica's invoke subject as the reply:
the server delivers the message there, with its stream's subject, and a body the puller chose (an event it sent
itself). Here an admin connection makes the same pull from a stream of the test's own, so that no replica of the
puller's races it for the message; what the victim's replica does with the delivery is the same.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig
from support.natsconn import connect as admin_connect
from support.polling import wait_for

from ember.wire import Invocation, natsflush, subjects

pytestmark = pytest.mark.integration


async def _steer(url: str, reply: str, frame: bytes) -> list[bytes]:
    """Deliver ``frame`` from a stream of the test's own to ``reply``; what came back on the delivery's own reply
    subject (its ack subject, where a replica that took the frame answers it)."""
    nc = await admin_connect(url)
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name="STEERED", subjects=["steered.>"]))
        await js.add_consumer("STEERED", ConsumerConfig(durable_name="puller", ack_policy=AckPolicy.EXPLICIT,
                                                        ack_wait=60))
        answers = await nc.subscribe("$JS.ACK.STEERED.>")
        await js.publish("steered.frame", frame)
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.STEERED.puller", b'{"batch": 1}', reply=reply)
        await natsflush.flush(nc)
        await asyncio.sleep(3)
        info = await js.consumer_info("STEERED", "puller")
        assert info.delivered.consumer_seq == 1  # it was delivered
        return await _drain(answers)
    finally:
        await js.delete_stream("STEERED")
        await nc.close()


async def _drain(sub: Any) -> list[bytes]:
    found = []
    while True:
        try:
            found.append((await sub.next_msg(timeout=0.1)).data)
        except Exception:  # nats' TimeoutError: nothing more
            return found


def test_a_delivery_steered_to_a_replicas_invoke_subject_is_not_taken(platform, http, hello):
    version = http.get("/v1/apps/hello").json()["version"]
    frame = msgspec.json.encode([Invocation(call_id="steered-call", function="greet", deadline=time.time() + 60,
                                            input=msgspec.Raw(b'"steered"'))])
    answered = asyncio.run(_steer(platform.nats_url, subjects.invoke("hello", "greet", version), frame))
    assert not any(b"steered" in data for data in answered), answered  # hello's replica ran nothing
    wait_for(lambda: http.post("/v1/hello/greet", json="x").json() == "Hello, x!", timeout_s=10,
             what="hello to answer as before")


def test_a_subject_matches_as_nats_delivers_it():
    m = subjects.matches
    assert m("a.b", "a.b") and not m("a.b", "a.c") and not m("a.b", "a.b.c")
    assert m("a.*", "a.b") and not m("a.*", "a.b.c") and not m("a.*", "a")
    assert m("a.*.c", "a.x.c") and not m("a.*.c", "a.x.d")
    assert m("a.>", "a.b") and m("a.>", "a.b.c") and not m("a.>", "a") and not m("a.>", "b.c")
