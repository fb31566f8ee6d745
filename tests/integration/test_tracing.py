"""Traces of real calls: a platform started with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at an OTLP/HTTP receiver in
this test, and the spans it receives: the gateway's, continuing the client's ``traceparent``; the replica's call, queue,
batch and run, carried there through NATS (in the call's frame, or in a queued call's message headers)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from support.auth import authed_client
from support.natsconn import connect as admin_connect
from support.otlp import CONSUMER, ERROR, SERVER, Receiver, Span
from support.paths import TEST_APPS
from support.platform import TestPlatform
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import app_view, deploy
from ember.wire import natsflush

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

APP = '''import time
from collections.abc import Iterator

import ember

app = ember.App("traced")


@app.function(batch=ember.Batch(max_size=8, window_ms=50))
def work(items: list[int]) -> list[int]:
    time.sleep(1.0)  # the calls that come meanwhile wait, and run together in the next batch
    return [i * 2 for i in items]


@app.function(timeout_s=60)
def relay(x: int) -> int:
    return ember.lookup("traced", "work").remote(x)  # a call between functions: through the control plane's relay


@app.function()
def count(n: int) -> Iterator[int]:
    yield from range(n)


@app.function(on="events.traced.demo.>", retries=0)
def seen(event: dict) -> int:
    return len(event["items"])
'''


class Traced:
    def __init__(self, platform: TestPlatform, otlp: Receiver, http: httpx.Client) -> None:
        self.platform, self.otlp, self.http = platform, otlp, http

    def spans_of(self, trace_id: str) -> list[Span]:
        return [s for s in self.otlp.snapshot() if s.trace_id == trace_id]

    def one(self, name: str, call_id: str | None = None, **where: object) -> Span | None:
        """The one span named ``name`` with these fields (and this ``ember.call_id``), if it came yet."""
        found = [s for s in self.otlp.snapshot() if s.name == name and all(getattr(s, k) == v for k, v in where.items())
                 and (call_id is None or s.attributes.get("ember.call_id") == call_id)]
        assert len(found) <= 1, found
        return found[0] if found else None


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    state = tmp_path_factory.mktemp("traced")
    (state / "app").mkdir()
    (state / "app" / "traced.py").write_text(APP)
    with Receiver() as otlp, pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # milliseconds between exports
        with TestPlatform(state / "ember") as platform:
            env.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")  # this process does not trace
            transport = Transport(platform.url, token=platform.token)
            deploy(state / "app" / "traced.py", transport=transport, timeout_s=180)
            transport.close()
            with authed_client(platform) as http:
                yield Traced(platform, otlp, http)


def client_parent() -> tuple[str, str]:
    return os.urandom(16).hex(), os.urandom(8).hex()


def test_a_call_is_traced_from_the_clients_span_through_nats_to_its_batch_and_run(traced: Traced) -> None:
    clients = [client_parent() for _ in range(3)]

    def call(n: int) -> httpx.Response:
        trace_id, span_id = clients[n]
        return traced.http.post("/v1/traced/work", json=n, headers={"traceparent": f"00-{trace_id}-{span_id}-01"})

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(call, 0)
        time.sleep(0.5)  # its batch runs (1 s): the next two come meanwhile, and wait to run together
        rest = [pool.submit(call, n) for n in (1, 2)]
        answers = [first.result(), *(f.result() for f in rest)]
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert [a.json() for a in answers] == [0, 2, 4]

    def complete() -> bool:
        spans = traced.otlp.snapshot()
        names = [{s.name for s in spans if s.trace_id == t} for t, _ in clients]
        return all({"ember.gateway", "ember.call", "ember.queue"} <= n for n in names) and \
            sum(s.name == "ember.run" for s in spans) >= 2
    wait_for(complete, timeout_s=30, what="the spans of three calls")

    batches = {s.span_id: s for s in traced.otlp.snapshot() if s.name == "ember.batch"}
    together = 0
    for (trace_id, client_span), answer in zip(clients, answers, strict=True):
        call_id = answer.headers["x-ember-call-id"]
        gateway = traced.one("ember.gateway", trace_id=trace_id)
        assert gateway is not None and gateway.parent_id == client_span and gateway.kind == SERVER
        assert gateway.service == "ember-platform"
        assert gateway.attributes["ember.call_id"] == call_id and gateway.attributes["ember.function"] == "work"
        assert gateway.attributes["http.response.status_code"] == 200
        replica_call = traced.one("ember.call", trace_id=trace_id)
        assert replica_call is not None and replica_call.parent_id == gateway.span_id  # across NATS
        assert replica_call.service == "ember-replica" and replica_call.kind == SERVER
        assert replica_call.resource["ember.app"] == "traced" and replica_call.resource["ember.replica_id"]
        assert replica_call.attributes["ember.call_id"] == call_id
        queue = traced.one("ember.queue", trace_id=trace_id)
        assert queue is not None and queue.parent_id == replica_call.span_id
        assert replica_call.start_ns <= queue.start_ns <= queue.end_ns <= replica_call.end_ns
        [(batch_trace, batch_id)] = queue.links
        batch = batches[batch_id]
        assert batch.trace_id == batch_trace and (trace_id, replica_call.span_id) in batch.links
        assert batch.attributes["ember.batch.size"] == len(batch.links)
        run = traced.one("ember.run", parent_id=batch.span_id)
        assert run is not None and run.trace_id == batch.trace_id and batch.start_ns <= run.start_ns
        together += len(batch.links) > 1
    assert together >= 2, "the calls that waited did not run in one batch"
    # The batch of a lone call is in that call's trace: the client's trace holds its whole path.
    lone = [b for b in batches.values() if len(b.links) == 1 and b.trace_id in {t for t, _ in clients}]
    assert lone and lone[0].parent_id == lone[0].links[0][1]


@pytest.mark.parametrize("bad", [
    "garbage",
    "00-" + "0" * 32 + "-" + "1" * 16 + "-01",  # an all-zero trace id is invalid
    "00-" + "1" * 32 + "-" + "0" * 16 + "-01",  # so is an all-zero span id
    "ff-" + "1" * 32 + "-" + "1" * 16 + "-01",  # version ff is forbidden
    "00-" + "A" * 32 + "-" + "1" * 16 + "-01",  # upper case
    "00-" + "1" * 32 + "-" + "1" * 16 + "-01-more",  # version 00 has four fields
    "00-" + "1" * 32 + "-" + "1" * 16 + "-01" + "x" * 4000,
])
def test_a_malformed_traceparent_is_ignored_and_the_call_starts_a_trace(traced: Traced, bad: str) -> None:
    answer = traced.http.post("/v1/traced/work", json=5, headers={"traceparent": bad, "tracestate": "a=" + bad})
    assert answer.status_code == 200 and answer.json() == 10
    call_id = answer.headers["x-ember-call-id"]
    gateway = wait_for(lambda: traced.one("ember.gateway", call_id), timeout_s=30,
                       what="the call's gateway span")
    assert gateway.parent_id == "" and gateway.trace_id not in bad and int(gateway.trace_id, 16)
    replica_call = wait_for(lambda: traced.one("ember.call", call_id), timeout_s=30,
                            what="the call's replica span")
    assert replica_call.trace_id == gateway.trace_id and replica_call.parent_id == gateway.span_id


def test_a_client_error_is_traced_as_the_clients_not_the_servers(traced: Traced) -> None:
    trace_id, client_span = client_parent()
    answer = traced.http.post("/v1/traced/work", json="not a number",
                              headers={"traceparent": f"00-{trace_id}-{client_span}-01"})
    assert answer.status_code == 422
    gateway = wait_for(lambda: traced.one("ember.gateway", trace_id=trace_id), timeout_s=30, what="the gateway span")
    assert gateway.parent_id == client_span and gateway.attributes["http.response.status_code"] == 422
    assert gateway.attributes["error.type"] and gateway.status != ERROR
    assert not [s for s in traced.spans_of(trace_id) if s.name == "ember.call"]  # it never left the gateway


def test_a_spawned_call_is_traced_through_its_queue_message(traced: Traced) -> None:
    trace_id, client_span = client_parent()
    submitted = traced.http.post("/v1/traced/work/spawn", json=21,
                                 headers={"traceparent": f"00-{trace_id}-{client_span}-01"})
    assert submitted.status_code == 202
    call_id = submitted.json()["call_id"]
    record = traced.http.get(f"/v1/calls/{call_id}", params={"wait": 60}).json()
    assert record["status"] == "succeeded" and record["output"] == 42

    def spans() -> dict[str, Span] | None:
        found = {s.name: s for s in traced.spans_of(trace_id)}
        return found if {"ember.spawn", "ember.call", "ember.queue"} <= found.keys() else None
    found = wait_for(spans, timeout_s=30, what="the spawned call's spans")
    spawn, replica_call, queue = found["ember.spawn"], found["ember.call"], found["ember.queue"]
    assert spawn.parent_id == client_span and spawn.kind == SERVER and spawn.attributes["ember.call_id"] == call_id
    assert spawn.attributes["http.response.status_code"] == 202
    assert replica_call.parent_id == spawn.span_id and replica_call.kind == CONSUMER  # the JetStream message's header
    assert replica_call.attributes["ember.call_id"] == call_id and replica_call.attributes["ember.attempt"] == 1
    assert queue.parent_id == replica_call.span_id and queue.start_ns == replica_call.start_ns
    assert replica_call.start_ns <= spawn.end_ns + 1_000_000_000  # it starts when the message was stored
    [(_, batch_id)] = queue.links
    assert traced.one("ember.run", parent_id=batch_id) is not None


def test_the_replicas_get_otel_settings_from_their_agent_but_name_their_own_service(traced: Traced,
                                                                                    tmp_path: Path) -> None:
    replica = next(s for s in traced.otlp.snapshot() if s.name == "ember.call")
    assert replica.resource["service.name"] == "ember-replica"
    assert replica.resource["ember.version"] == 1 and replica.resource["ember.service"] == "work"
    assert replica.resource["service.instance.id"] == replica.resource["ember.replica_id"]


def test_an_event_published_with_a_traceparent_continues_its_publishers_trace(traced: Traced) -> None:
    trace_id, publisher_span = client_parent()

    async def publish() -> list[int]:
        nc = await admin_connect(traced.platform.nats_url)
        try:
            inbox = f"_EMBER.replies.traced.{uuid.uuid4().hex}"  # the app's reply subjects
            results: asyncio.Queue = asyncio.Queue()
            await nc.subscribe(inbox, cb=results.put)
            await natsflush.flush(nc)
            for traceparent in (f"00-{trace_id}-{publisher_span}-01", "00-not-a-trace-01"):
                await nc.publish("events.traced.demo.a", json.dumps({"items": [1, 2, 3]}).encode(),
                                 headers={"traceparent": traceparent, "Ember-Reply-To": inbox})
            return sorted([json.loads((await asyncio.wait_for(results.get(), 60)).data) for _ in range(2)])
        finally:
            await nc.close()

    assert asyncio.run(publish()) == [3, 3]
    replica_call = wait_for(lambda: traced.one("ember.call", trace_id=trace_id), timeout_s=30, what="the event's span")
    assert replica_call.parent_id == publisher_span and replica_call.kind == CONSUMER
    assert replica_call.attributes["ember.function"] == "seen"

    def roots() -> list[Span]:  # the event with the malformed traceparent: a trace of its own
        return [s for s in traced.otlp.snapshot() if s.name == "ember.call" and s.attributes["ember.function"] == "seen"
                and s.parent_id == ""]
    assert wait_for(roots, timeout_s=30, what="the other event's span")


def test_a_call_one_function_makes_of_another_stays_in_the_callers_trace(traced: Traced) -> None:
    trace_id, client_span = client_parent()
    answer = traced.http.post("/v1/traced/relay", json=4, headers={"traceparent": f"00-{trace_id}-{client_span}-01"})
    assert answer.status_code == 200 and answer.json() == 8

    def spans() -> list[Span] | None:
        found = traced.spans_of(trace_id)
        return found if sum(s.name == "ember.call" for s in found) == 2 and sum(
            s.name == "ember.run" for s in found) == 2 and any(s.name == "ember.relay" for s in found) else None
    found = wait_for(spans, timeout_s=30, what="both calls' spans in one trace")
    by_id = {s.span_id: s for s in found}
    outer = next(s for s in found if s.name == "ember.call" and s.attributes["ember.function"] == "relay")
    inner = next(s for s in found if s.name == "ember.call" and s.attributes["ember.function"] == "work")
    relayed = by_id[inner.parent_id]  # the control plane's span of the relayed call
    assert relayed.name == "ember.relay" and relayed.service == "ember-platform"
    caller_run = by_id[relayed.parent_id]  # a child of the run that made the call
    assert caller_run.name == "ember.run" and by_id[caller_run.parent_id].name == "ember.batch"
    assert by_id[caller_run.parent_id].parent_id == outer.span_id


def test_a_streamed_call_is_traced_until_its_last_item(traced: Traced) -> None:
    trace_id, client_span = client_parent()
    answer = traced.http.post("/v1/traced/count", json=3, headers={"traceparent": f"00-{trace_id}-{client_span}-01"})
    assert answer.status_code == 200
    assert [json.loads(line) for line in answer.text.splitlines()][:3] == [{"item": 0}, {"item": 1}, {"item": 2}]

    def spans() -> dict[str, Span] | None:
        found = {s.name: s for s in traced.spans_of(trace_id)}
        return found if {"ember.gateway", "ember.call", "ember.run"} <= found.keys() else None
    found = wait_for(spans, timeout_s=30, what="the streamed call's spans")
    gateway, replica_call, run = found["ember.gateway"], found["ember.call"], found["ember.run"]
    assert gateway.parent_id == client_span and replica_call.parent_id == gateway.span_id
    assert replica_call.attributes["ember.stream"] is True and replica_call.attributes["ember.function"] == "count"
    assert run.end_ns <= replica_call.end_ns  # the call's span ends with the stream, after the generator's run


def test_a_control_plane_with_tracing_off_sends_no_spans_and_carries_no_context(
        traced: Traced, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", traced.otlp.endpoint)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")  # off, whatever else is set
    url = traced.platform.add_control_plane("untraced")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    trace_id, client_span = client_parent()
    answer = traced.http.post(f"{url}/v1/traced/work", json=1,
                              headers={"traceparent": f"00-{trace_id}-{client_span}-01"})
    assert answer.status_code == 200 and answer.json() == 2
    call_id = answer.headers["x-ember-call-id"]
    # The (traced) replica still traces the call, in a trace of its own: nothing came from the control plane.
    replica_call = wait_for(lambda: traced.one("ember.call", call_id), timeout_s=30, what="the replica's span")
    assert replica_call.parent_id == "" and replica_call.trace_id != trace_id
    time.sleep(1.0)  # ten export periods: a span the control plane had made would be here by now
    assert not traced.spans_of(trace_id) and traced.one("ember.gateway", call_id) is None


def test_a_replica_forked_from_a_zygote_traces_too(traced: Traced, tmp_path: Path) -> None:
    app_file = tmp_path / "snapper.py"
    app_file.write_text((TEST_APPS / "snap" / "snapper.py").read_text())
    transport = Transport(traced.platform.url, token=traced.platform.token)
    try:
        deploy(app_file, transport=transport, timeout_s=180)
        replicas = [r for s in app_view(transport, "snapper").services for r in s.replicas if r.state == "ready"]
    finally:
        transport.close()
    assert replicas and all(r.start is not None and r.start.kind == "zygote" for r in replicas)
    trace_id, client_span = client_parent()
    answer = traced.http.post("/v1/snapper/Model.predict", json=[0.5, -1.0, 2.0, 0.25],
                              headers={"traceparent": f"00-{trace_id}-{client_span}-01"})
    assert answer.status_code == 200, answer.text
    replica_call = wait_for(lambda: traced.one("ember.call", trace_id=trace_id), timeout_s=30, what="the fork's span")
    # each process exports its spans in batches of its own: the gateway's may come after the replica's
    gateway = wait_for(lambda: traced.one("ember.gateway", trace_id=trace_id), timeout_s=30, what="the gateway's span")
    assert replica_call.parent_id == gateway.span_id
    assert replica_call.resource["ember.replica_id"] in {r.replica_id for r in replicas}
