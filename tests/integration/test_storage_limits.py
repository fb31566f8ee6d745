"""Storage limits against a real nats-server: every stream, bucket and object store is bounded (each function's
event stream too), large results expire with their records, a full work queue refuses a spawn and a full event
stream an event (nothing queued is dropped), and bundles that no kept version uses are collected while the deployed
ones stay."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from nats.js.api import DiscardPolicy, StreamConfig
from support.natsconn import connect as admin_connect
from support.platform import TestPlatform

from ember._bundle import build_bundle
from ember._client import Transport
from ember._deploy import deploy
from ember.wire import AppView, subjects
from ember.wire.jetstream import CALL_TTL_S, StorageLimits, apply_limits, ensure_buckets, js_replicas
from ember_platform.control.bundle_gc import collect_bundles, list_bundles
from ember_platform.control.owners import Owners

pytestmark = pytest.mark.integration
EVERY_STREAM = ["EMBER_CALLS", "EMBER_DEAD", "KV_ember_calls", "KV_ember_deployments", "KV_ember_assignments",
                "KV_ember_nodes", "KV_ember_replicas", "KV_ember_results", "OBJ_ember_bundles", "EMBER_LOGS",
                "KV_ember_owners"]


def test_every_stream_bucket_and_object_store_is_bounded(platform: TestPlatform) -> None:
    async def run() -> dict[str, object]:
        nc = await admin_connect(platform.nats_url)
        try:
            js = nc.jetstream()
            return {name: (await js.stream_info(name)).config for name in EVERY_STREAM}
        finally:
            await nc.close()

    configs = asyncio.run(run())
    for name, config in configs.items():
        assert config.max_bytes > 0, name  # type: ignore[attr-defined]
    assert configs["KV_ember_results"].max_age >= CALL_TTL_S  # type: ignore[attr-defined]
    assert configs["EMBER_CALLS"].discard == DiscardPolicy.NEW  # type: ignore[attr-defined]
    assert configs["EMBER_CALLS"].max_msgs > 0  # type: ignore[attr-defined]
    # set, not nats-server's default of 1,000 consumers a stream (about 500 apps of one function)
    assert configs["EMBER_CALLS"].max_consumers == StorageLimits().calls_stream_max_consumers  # type: ignore[attr-defined]


def test_an_installation_with_the_servers_consumer_limit_gets_ours(platform: TestPlatform) -> None:
    async def run() -> tuple[int, int]:
        nc = await admin_connect(platform.nats_url)
        try:
            js = nc.jetstream()
            config = (await js.stream_info(subjects.CALLS_STREAM)).config
            await js.update_stream(config.evolve(max_consumers=1000))  # as nats-server 2.15 made an older Ember's
            before = (await js.stream_info(subjects.CALLS_STREAM)).config.max_consumers or 0
            await apply_limits(js, StorageLimits())
            return before, (await js.stream_info(subjects.CALLS_STREAM)).config.max_consumers or 0
        finally:
            await nc.close()

    assert asyncio.run(run()) == (1000, StorageLimits().calls_stream_max_consumers)


def test_an_installation_without_limits_gets_them(platform: TestPlatform) -> None:
    async def run() -> tuple[int, int, list[str]]:
        nc = await admin_connect(platform.nats_url)
        try:
            js = nc.jetstream()
            config = (await js.stream_info(subjects.DEAD_STREAM)).config
            await js.update_stream(config.evolve(max_bytes=-1))  # as an older Ember created it
            changed = await apply_limits(js, StorageLimits())
            again = await apply_limits(js, StorageLimits())
            after = (await js.stream_info(subjects.DEAD_STREAM)).config.max_bytes or 0
            return after, len(changed), again
        finally:
            await nc.close()

    after, changed, again = asyncio.run(run())
    assert after == StorageLimits().dead_stream_max_bytes
    assert changed == 1 and again == []


def test_a_full_calls_stream_refuses_a_spawn_and_drops_nothing(platform: TestPlatform, probe: AppView,
                                                               http: httpx.Client) -> None:
    filler = subjects.calls("storage-limits", "nobody")  # no consumer: it stays queued

    async def fill() -> int:
        nc = await admin_connect(platform.nats_url)
        try:
            js = nc.jetstream()
            await js.publish(filler, b"{}")
            info = await js.stream_info(subjects.CALLS_STREAM)
            await js.update_stream(info.config.evolve(max_msgs=info.state.messages))
            return info.state.messages
        finally:
            await nc.close()

    async def restore() -> int:
        nc = await admin_connect(platform.nats_url)
        try:
            js = nc.jetstream()
            messages = (await js.stream_info(subjects.CALLS_STREAM)).state.messages
            await apply_limits(js, StorageLimits.from_env())
            await js.purge_stream(subjects.CALLS_STREAM, subject=filler)
            return messages
        finally:
            await nc.close()

    try:
        queued = asyncio.run(fill())
        response = http.post("/v1/probe/work/spawn", json={"n": 1})
        assert queued >= 1
    finally:
        left = asyncio.run(restore())
    assert response.status_code == 503, response.text
    assert "maximum messages exceeded" in response.text
    assert response.headers.get("retry-after")
    assert left >= 1  # the filler is still queued: a full queue refuses the new call, it drops no old one


EVENTFUL = '''import time
import ember

app = ember.App("full-events")


@app.function(on="events.full-events.in", timeout_s=60)
def slow(event: dict) -> None:
    time.sleep(event["sleep_s"])
'''


def test_a_full_event_stream_refuses_an_event_and_drops_none(platform: TestPlatform, transport: Transport,
                                                              http: httpx.Client, tmp_path: Path) -> None:
    (tmp_path / "full_events.py").write_text(EVENTFUL)
    deploy(tmp_path / "full_events.py", transport=transport, timeout_s=120)
    stream = subjects.events_stream("full-events", "slow")

    async def full() -> tuple[object, int]:  # its config; how many events it holds, made its limit
        nc = await admin_connect(platform.nats_url)
        try:
            js = nc.jetstream()
            info = await js.stream_info(stream)
            await js.update_stream(info.config.evolve(max_msgs=info.state.messages))
            return info.config, info.state.messages
        finally:
            await nc.close()

    async def held() -> int:
        nc = await admin_connect(platform.nats_url)
        try:
            return (await nc.jetstream().stream_info(stream)).state.messages
        finally:
            await nc.close()

    try:
        assert http.post("/v1/events/events.full-events.in", json={"sleep_s": 50}).status_code == 202
        config, holding = asyncio.run(full())  # the sleeping event is held until its call ends
        refused = http.post("/v1/events/events.full-events.in", json={"sleep_s": 0})
        left = asyncio.run(held())
    finally:
        transport.request("DELETE", "/v1/apps/full-events")
    limits = StorageLimits()
    assert isinstance(config, StreamConfig)
    assert config.max_msgs == limits.events_stream_max_msgs and config.discard == DiscardPolicy.NEW
    assert 0 < (config.max_bytes or 0) <= limits.events_stream_max_bytes  # (halved where the disk is small)
    assert config.num_replicas == js_replicas()
    assert refused.status_code == 429, refused.text
    assert "full" in refused.json()["error"]["message"] and refused.headers.get("retry-after")
    assert holding == left == 1  # the full stream refused the new event; the one it held is still there


def test_unused_bundles_are_collected_and_deployed_ones_stay(platform: TestPlatform, probe: AppView,
                                                             http: httpx.Client, tmp_path: Path) -> None:
    (tmp_path / "unused.py").write_text("X = 1\n")
    unused = build_bundle(tmp_path)
    assert http.put(f"/v1/bundles/{unused.sha256}", content=unused.data).status_code in (200, 201, 204)

    async def run() -> tuple[list[str], list[str], set[str], list[list[str]]]:
        nc = await admin_connect(platform.nats_url)
        try:
            stores = await ensure_buckets(nc.jetstream())
            owners = await Owners.open(nc.jetstream())
            recorded = [await owners.patterns("bundle", unused.sha256)]
            young = await collect_bundles(stores, lambda: (), grace_s=3600.0)  # uploaded just now: kept
            old = await collect_bundles(stores, lambda: (), grace_s=0.0,
                                        forget=lambda sha: owners.forget("bundle", sha))
            left: set[str] = set()
            for _ in range(5):  # (an object store's listing may come short: nats-py's watch can say "all sent" first)
                left |= {b.sha256 for b in await list_bundles(stores)}
            return young, old, left, [*recorded, await owners.patterns("bundle", unused.sha256)]
        finally:
            await nc.close()

    young, old, left, records = asyncio.run(run())
    assert unused.sha256 not in young
    assert unused.sha256 in old
    assert unused.sha256 not in left
    assert records == [["*"], []]  # who uploaded it is forgotten with it
    assert probe.bundle_sha256 in left  # deployed: in the deployments' KV, whatever the caller holds
    assert http.post("/v1/probe/work", json={"n": 2}).status_code == 200
