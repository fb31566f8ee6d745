"""Whose error a call ends with, and the attempts of one call, end to end.

An ``unavailable`` or ``deadline_exceeded`` that a function raises is its own error: a synchronous call of it is not
sent again (a replica's refusal, before any run, would be), and a queued one fails under its retries rather than
expiring. A generator's call answered as one collected JSON list is closed when its client leaves. And a replica that
holds two attempts of one streamed call (the gateway sent it again and both reached this replica) ends both on the
call's cancel, and gives a credit to the attempt the gateway reads: here a stand-in gateway (a plain connection on the
session's real nats-server) sends the attempts to a real replica."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter

import httpx
import msgspec
import pytest
from support.natsconn import connect as admin_connect
from support.paths import REPO
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import app_view
from ember.wire import AppView, Invocation, encoder, natsflush, subjects
from ember.wire.streams import STREAM_WINDOW, StreamCredit, chunk_decoder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
APP = "attempts"
TICKER = f"/v1/{APP}/Ticker"
WAIT_S = 60.0  # for what must come; a generator left running would run for its 300 s deadline


@pytest.fixture(scope="module")
def attempts(deployed) -> AppView:
    return deployed(REPO / "tests" / "apps" / "attempts" / "attempts.py")


def _key() -> str:
    return uuid.uuid4().hex[:12]


def _logged(transport: Transport, service: str, marker: str) -> int:
    lines = transport.json("GET", f"/v1/apps/{APP}/logs", params={"service": service, "limit": 5000})
    return sum(marker in line["line"] for line in lines)


def _closed(http: httpx.Client) -> list[str]:
    return http.post(f"{TICKER}.closed_tags", json={}).json()


def test_an_unavailable_the_function_raises_is_answered_not_sent_again(attempts, http, transport):
    key = _key()
    answer = http.post(f"/v1/{APP}/refuses", json=key, timeout=90)
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error["type"] == "UnavailableError" and "store is down" in error["message"], error
    assert answer.headers.get("retry-after") == "2", answer.headers
    marker = f"refuses({key}) ran"
    wait_for(lambda: _logged(transport, "refuses", marker), what="its run's log line")
    assert _logged(transport, "refuses", marker) == 1  # one run: no retry policy ran it again


def test_a_deadline_the_function_raises_is_its_error_not_the_calls_expiry(attempts, http, transport):
    """As a ``.remote()`` whose answer never came raises it in the function's code: the call ran and failed; its own
    deadline (60 s) is far."""
    answer = http.post(f"/v1/{APP}/gives_up", json=_key(), timeout=90)
    assert answer.status_code == 504, answer.text
    assert answer.json()["error"]["type"] == "DeadlineExceededError", answer.text
    key = _key()
    spawned = http.post(f"/v1/{APP}/gives_up/spawn", json=key)
    assert spawned.status_code == 202, spawned.text
    record = http.get(f"/v1/calls/{spawned.json()['call_id']}", params={"wait": 60}, timeout=90).json()
    assert record["status"] == "failed" and record["attempts"] == 1, record  # retries=0, and not expired
    assert record["error"]["code"] == "deadline_exceeded", record
    assert record["error"]["type"] == "DeadlineExceededError", record


def test_a_stream_collected_as_json_whose_client_times_out_closes_its_generator(attempts, http):
    """Nothing is written until the stream ends (its 300 s deadline): the gateway watches the client meanwhile."""
    tag = _key()
    with pytest.raises(httpx.ReadTimeout):
        http.post(f"{TICKER}.ticks", json=tag, headers={"Accept": "application/json"},
                  timeout=httpx.Timeout(30, read=1))
    wait_for(lambda: tag in _closed(http), timeout_s=WAIT_S, what="the generator closed after its client left")


class _Gateway:
    """A stand-in gateway: sends attempts of a streamed call straight to one replica, each with a reply subject of
    its own, and counts the items each attempt sent."""

    def __init__(self, nc, replica_id: str) -> None:
        self.nc = nc
        self.replica_id = replica_id
        self.inbox = f"{subjects.answers_inbox(uuid.uuid4().hex[:16])}.{APP}"
        self.items: Counter[str] = Counter()  # reply token -> items received
        self.accepted: set[str] = set()

    async def listen(self) -> None:
        async def take(msg) -> None:
            token = msg.subject.rsplit(".", 1)[1]
            chunk = chunk_decoder.decode(msg.data)
            if chunk.replica:
                self.accepted.add(token)
            self.items[token] += len(chunk.items)

        await self.nc.subscribe(f"{self.inbox}.*", cb=take)

    async def attempt(self, call_id: str, tag: str) -> str:
        token = uuid.uuid4().hex[:16]
        call = Invocation(call_id=call_id, function="Ticker.ticks", deadline=time.time() + 300,
                          input=msgspec.Raw(json.dumps(tag).encode()))
        await self.nc.publish(subjects.replica_invoke(self.replica_id), encoder.encode([call]),
                              reply=f"{self.inbox}.{token}")
        return token

    async def until(self, what: str, holds) -> None:
        give_up = time.monotonic() + WAIT_S
        while not holds():
            assert time.monotonic() < give_up, f"timed out waiting for {what}: {dict(self.items)}"
            await asyncio.sleep(0.05)


def test_an_attempt_superseded_on_its_replica_ends_and_a_cancel_ends_the_latest(attempts, platform, transport, http):
    """The gateway reads only the latest attempt of a call: the one before it, on the same replica, is ended when the
    next comes, not left to spend its credit and hold its slot until the call's deadline (300 s here); the call's
    cancel ends the latest. (Before that, the replica kept one stream per call id: the first attempt's generator,
    reached by no cancel, ran until the deadline.)"""
    (replica,) = [r.replica_id for s in app_view(transport, APP).services if s.name == "Ticker"
                  for r in s.replicas if r.state == "ready"]
    call_id, tag = uuid.uuid4().hex, _key()

    async def scenario() -> None:
        nc = await admin_connect(platform.nats_url)
        try:
            gateway = _Gateway(nc, replica)
            await gateway.listen()
            first = await gateway.attempt(call_id, tag)
            await gateway.until("the first attempt's credit spent", lambda: gateway.items[first] == STREAM_WINDOW)
            second = await gateway.attempt(call_id, tag)  # sent again: the same replica takes it too
            await gateway.until("the second attempt's credit spent", lambda: gateway.items[second] == STREAM_WINDOW)
            assert gateway.accepted == {first, second}
            wait_for(lambda: _closed(http).count(tag) == 1, timeout_s=WAIT_S, what="the superseded attempt closed")
            credit = StreamCredit(call_id=call_id, upto=STREAM_WINDOW + 8)  # for the attempt the gateway reads
            await nc.publish(subjects.replica_credit(replica), encoder.encode(credit))
            await gateway.until("the latest attempt's next items", lambda: gateway.items[second] == STREAM_WINDOW + 8)
            assert gateway.items[first] == STREAM_WINDOW  # superseded: no credit reaches it
            await nc.publish(subjects.replica_cancel(replica), call_id.encode())
            await natsflush.flush(nc)
        finally:
            await nc.close()

    asyncio.run(scenario())
    wait_for(lambda: _closed(http).count(tag) == 2, timeout_s=WAIT_S, what="the latest attempt's generator closed")
