"""Streaming outputs and concurrent inputs, end to end: real HTTP, a real nats-server, real replicas."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from support import natsconn
from support.auth import authed_client
from support.overlap import most_at_once
from support.paths import REPO
from support.polling import wait_for

import ember
from ember.wire import HTTP_TIMEOUT_HEADER, AppView, load_decoder, natsflush, subjects

pytestmark = pytest.mark.integration
STREAMER = "/v1/streams/Streamer"


@pytest.fixture(scope="session")
def streams(deployed) -> AppView:
    return deployed(REPO / "tests" / "apps" / "streams" / "streams.py")


def _sse_events(response: httpx.Response):
    """(event, data, seen_at) for each Server-Sent Event as it arrives."""
    event, data = "message", []
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[len("event: "):]
        elif line.startswith("data: "):
            data.append(line[len("data: "):])
        elif line == "" and data:
            yield event, json.loads("\n".join(data)), time.time()
            event, data = "message", []


def _closed_tags(http: httpx.Client) -> list[str]:
    return http.post(f"{STREAMER}.closed_tags", json={}).json()


def test_sse_items_arrive_one_by_one(streams, http):
    with http.stream("POST", f"{STREAMER}.count", json={"n": 5, "delay": 0.3},
                     headers={"Accept": "text/event-stream"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert len(response.headers["x-ember-call-id"]) == 32
        events = list(_sse_events(response))
    kinds = [kind for kind, _, _ in events]
    assert kinds == ["item"] * 5 + ["end"]
    items = [data for kind, data, _ in events if kind == "item"]
    assert [item["i"] for item in items] == list(range(5))
    assert events[-1][1] == {"items": 5}
    first_seen = events[0][2]
    last_produced = items[-1]["at"]
    # the first item reached the client before the replica had even produced the last one (1.2 s later)
    assert first_seen < last_produced - 0.5


def test_ndjson_is_the_default(streams, http):
    with http.stream("POST", f"{STREAMER}.many", json=3) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert lines == [{"item": "item-0"}, {"item": "item-1"}, {"item": "item-2"}, {"end": True, "items": 3}]


def test_accept_json_alone_collects_the_list(streams, http):
    response = http.post(f"{STREAMER}.many", json=3, headers={"Accept": "application/json"})
    assert response.status_code == 200
    assert response.json() == ["item-0", "item-1", "item-2"]


@pytest.mark.parametrize("accept", ["garbage", ",,,;;;", "text/event-stream;q=0", "*/*;q=bad", "\u00e9" * 300,
                                    ", ".join(["application/json;q=0"] * 100)])
def test_accept_header_garbage_gets_ndjson(streams, http, accept):
    response = http.post(f"{STREAMER}.many", json=2, headers={"Accept": accept.encode("utf-8", "replace")})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    assert response.text.splitlines()[-1] == '{"end":true,"items":2}'


def test_an_error_after_the_first_item_is_the_final_event(streams, http):
    with http.stream("POST", f"{STREAMER}.fails_after", json=2,
                     headers={"Accept": "text/event-stream"}) as response:
        assert response.status_code == 200
        events = list(_sse_events(response))
    assert [kind for kind, _, _ in events] == ["item", "item", "error"]
    error = events[-1][1]["error"]
    assert error["code"] == "user_error" and error["type"] == "ValueError"
    assert "broke after 2 items" in error["message"]
    ndjson = http.post(f"{STREAMER}.fails_after", json=1).text.splitlines()
    assert json.loads(ndjson[0]) == {"item": 0}
    assert json.loads(ndjson[-1])["error"]["type"] == "ValueError"


def test_hostile_bodies_and_items(streams, http):
    too_large = http.post(f"{STREAMER}.big", json={"n": 1, "kb": 9 * 1024})  # one item over a NATS message (8 MB)
    assert too_large.status_code == 500
    assert "limit of a NATS message" in too_large.json()["error"]["message"]
    packed = http.post(f"{STREAMER}.many", content=b"\x03", headers={"Content-Type": "application/msgpack"})
    assert packed.status_code == 415 and packed.json()["error"]["field"] == "Content-Type"
    huge = http.post(f"{STREAMER}.many", content=b"1" + b" " * (5 * 1024 * 1024))
    assert huge.status_code == 413
    assert http.post("/v1/streams/Streamer.nope", json=1).status_code == 404
    assert http.post(f"{STREAMER}.many", json=1, headers={"Authorization": "Bearer nope"}).status_code == 401


def test_an_error_before_the_first_item_is_the_status(streams, http):
    response = http.post(f"{STREAMER}.fails_after", json=0, headers={"Accept": "text/event-stream"})
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "ValueError"
    bad = http.post(f"{STREAMER}.count", json={"n": "many"})
    assert bad.status_code == 422
    assert bad.json()["error"]["field"] == "$.n"


@pytest.mark.parametrize("method", ["ticks", "aticks"])
def test_a_client_that_goes_away_closes_the_generator(streams, platform, method):
    tag = f"{method}-{time.time_ns()}"
    with authed_client(platform) as client, client.stream(
            "POST", f"{STREAMER}.{method}", json=tag, headers={"Accept": "text/event-stream"}) as response:
        events = _sse_events(response)
        assert [next(events)[1] for _ in range(3)] == [0, 1, 2]
    # the connection is closed: the replica closes the generator, whose finally notes the tag, long before the
    # call's deadline (30 s) or its credit running out could have stopped it
    with authed_client(platform) as client:
        wait_for(lambda: tag in _closed_tags(client), timeout_s=15, what=f"{method}'s finally to run")


def test_a_client_that_goes_away_before_the_first_item_closes_the_generator(streams, platform):
    tag = f"early-{time.time_ns()}"
    with authed_client(platform) as client, pytest.raises(httpx.ReadTimeout):
        client.post(f"{STREAMER}.slow_start", json=tag, timeout=httpx.Timeout(10, read=0.5))
    with authed_client(platform) as client:
        # closed at once, not after its 20 s wait: the cancel reached it while it waited for its first item
        wait_for(lambda: tag in _closed_tags(client), timeout_s=10, what="slow_start's finally to run")


def test_a_slow_reader_holds_the_generator_back(streams, http):
    # 200 items of 256 KiB: far more than the credit window and the sockets' buffers hold together
    with http.stream("POST", f"{STREAMER}.big", json={"n": 200, "kb": 256}) as response:
        lines = response.iter_lines()
        first = json.loads(next(lines))["item"]
        time.sleep(2.0)  # the reader stalls
        resumed = time.time()
        rest = [json.loads(line) for line in lines if line]
    items = [first] + [line["item"] for line in rest[:-1]]
    assert rest[-1] == {"end": True, "items": 200}
    assert [item["i"] for item in items] == list(range(200))
    # without flow control the replica would have produced everything within the first second
    assert items[-1]["at"] > resumed
    assert items[0]["at"] < resumed - 1.5


def test_a_stream_that_never_ends_is_bounded_by_the_call_timeout(streams, http):
    started = time.monotonic()
    with http.stream("POST", f"{STREAMER}.forever", json={}, headers={"Accept": "text/event-stream",
                                                                      HTTP_TIMEOUT_HEADER: "2"}) as response:
        events = list(_sse_events(response))
    took = time.monotonic() - started
    assert events[-1][0] == "error"
    assert events[-1][1]["error"]["code"] == "deadline_exceeded"  # ended by its deadline, no other bound
    assert len(events) > 10
    assert took >= 2  # not before the call's timeout


def test_an_async_stream_past_its_deadline_is_cancelled_and_closed(streams, http):
    tag = f"late-{time.time_ns()}"
    with http.stream("POST", f"{STREAMER}.aticks", json=tag, headers={"Accept": "text/event-stream",
                                                                     HTTP_TIMEOUT_HEADER: "1"}) as response:
        events = list(_sse_events(response))
    assert events[-1][0] == "error" and events[-1][1]["error"]["code"] == "deadline_exceeded"
    assert tag in _closed_tags(http)  # its finally ran before the error event went out


def test_spawn_of_a_streaming_function_stores_the_list(streams, ember_url):
    many = ember.lookup("streams", "Streamer.many")
    assert many.spawn(4).get(timeout=60) == ["item-0", "item-1", "item-2", "item-3"]


def test_sdk_remote_gen_yields_typed_items(streams, ember_url, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "tests" / "apps" / "streams"))
    import streams as app_module

    ticks = list(app_module.Streamer.count.remote_gen(3))
    assert [t.i for t in ticks] == [0, 1, 2]
    assert all(isinstance(t, app_module.Tick) for t in ticks)
    with pytest.raises(TypeError, match="remote_gen"):
        app_module.Streamer.count.remote(3)
    spawned = app_module.Streamer.count.spawn(2).get(timeout=60)  # queued: the list, typed
    assert [t.i for t in spawned] == [0, 1] and all(isinstance(t, app_module.Tick) for t in spawned)
    with pytest.raises(ember.RemoteError, match="broke after 1"):
        list(app_module.Streamer.fails_after.remote_gen(1))
    assert list(ember.lookup("streams", "Streamer.many").remote_gen(2)) == ["item-0", "item-1"]
    assert ember.lookup("streams", "Streamer.many").remote(2) == ["item-0", "item-1"]  # untyped: the list

    async def agen() -> list[int]:
        return [t.i async for t in app_module.Streamer.count.remote_gen.aio(4)]

    assert asyncio.run(agen()) == [0, 1, 2, 3]


def test_sdk_leaving_the_loop_closes_the_generator(streams, ember_url, http):
    ticks = ember.lookup("streams", "Streamer.ticks")
    tag = f"sdk-{time.time_ns()}"
    for i in ticks.remote_gen(tag):
        if i == 2:
            break
    wait_for(lambda: tag in _closed_tags(http), timeout_s=15, what="the generator's finally to run")


def test_ember_call_prints_items_as_they_come(streams, platform, ember_cli):
    proc = ember_cli("call", "streams.Streamer.many", "--data", "3", url=platform.url)
    assert proc.stdout.splitlines() == ['"item-0"', '"item-1"', '"item-2"']
    env = {**os.environ, "EMBER_URL": platform.url, "EMBER_TOKEN": platform.token}
    with subprocess.Popen([sys.executable, "-m", "ember.cli", "call", "streams.Streamer.count", "--data",
                           '{"n": 4, "delay": 0.4}'], stdout=subprocess.PIPE, text=True, env=env) as cli:
        assert cli.stdout is not None
        seen = [(json.loads(line), time.time()) for line in cli.stdout]
    assert [tick["i"] for tick, _ in seen] == [0, 1, 2, 3]
    assert seen[0][1] < seen[-1][0]["at"]  # printed before the replica produced the last item
    assert cli.returncode == 0


@pytest.mark.parametrize("fn", ["nap", "doze"])
def test_one_replica_holds_max_concurrency_calls_at_once(streams, http, fn):
    http.post(f"/v1/streams/{fn}", json=0.0)  # warm
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda _: http.post(f"/v1/streams/{fn}", json=0.2), range(32)))
    assert all(a.status_code == 200 for a in answers)
    threads = {a.json()["thread"] for a in answers}
    if fn == "nap":
        assert threads == {"MainThread"}  # async def runs on the replica's event loop
    else:
        assert len(threads) > 1 and all(t.startswith("ember-doze") for t in threads)
    assert most_at_once(a.json()["span"] for a in answers) > 1  # one at a time, no two would overlap


def test_load_reports_count_the_slots(streams, platform):
    async def one_report() -> int:
        nc = await natsconn.connect(platform.nats_url)
        try:
            sub = await nc.subscribe(subjects.stats("streams", "nap"))
            report = load_decoder.decode((await sub.next_msg(timeout=5)).data)
            return report.slots
        finally:
            await nc.close()

    assert asyncio.run(one_report()) == 32


EVENT_APP = '''from collections.abc import AsyncIterator
import ember
app = ember.App("streamevents")

@app.function(on="events.streamevents.words.>", result_subject="events.streamevents.results", retries=0)
async def words(text: str) -> AsyncIterator[str]:
    for word in text.split():
        yield word.upper()
'''


def test_an_event_to_a_streaming_function_publishes_the_list(tmp_path, platform, transport):
    app_file = tmp_path / "streamevents.py"
    app_file.write_text(EVENT_APP)
    ember.deploy(app_file, transport=transport, timeout_s=120)

    async def exchange() -> bytes:
        nc = await natsconn.connect(platform.nats_url)
        try:
            results: asyncio.Queue = asyncio.Queue()
            await nc.subscribe("events.streamevents.results", cb=results.put)
            await natsflush.flush(nc)
            await nc.jetstream().publish("events.streamevents.words.a", b'"to be or not"',
                                         headers={"Nats-Msg-Id": "w-1"})
            msg = await asyncio.wait_for(results.get(), 60)
            assert msg.headers["Ember-Status"] == "succeeded"
            return msg.data
        finally:
            await nc.close()

    assert json.loads(asyncio.run(exchange())) == ["TO", "BE", "OR", "NOT"]
