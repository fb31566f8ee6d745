"""The node agent stops replicas together (each may take its drain grace), and a bundle uploaded again long
after its first upload is stored again, so that the collector cannot take it between a push's upload and its
deploy."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path

import httpx
import msgspec
import pytest
from support.auth import bearer
from support.natsconn import all_keys
from support.natsconn import connect as admin_connect
from support.paths import TEST_APPS
from support.platform import TestPlatform
from support.polling import wait_for

from ember._bundle import build_bundle
from ember._client import Transport
from ember._deploy import deploy
from ember.wire import ReplicaStatus, subjects

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_replicas_being_removed_drain_together_not_one_after_another(platform, transport, http):
    deploy(TEST_APPS / "wedge" / "wedge.py", transport=transport, timeout_s=120)

    def lingering() -> list[str]:
        services = http.get("/v1/apps/wedge").json()["services"]
        return [r["replica_id"] for s in services if s["name"] == "linger" for r in s["replicas"]
                if r["state"] == "ready"]

    replicas = wait_for(lambda: len(lingering()) == 2 and lingering(), timeout_s=60, what="two linger replicas")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # Each replica holds a call that sleeps 8 s, so each one's drain takes that long.
        calls = [pool.submit(httpx.post, f"{platform.url}/v1/wedge/linger", json=8, timeout=60,
                             headers=bearer(platform.token)) for _ in range(4)]
        wait_for(lambda: _in_flight(http) >= 2, timeout_s=30, what="both replicas busy")
        assert http.delete("/v1/apps/wedge").status_code == 204
        both = wait_for(lambda: _states(platform.nats_url, replicas) == {"stopping"} or None, timeout_s=30,
                        what="both replicas draining at once")
        assert both
        for call in calls:
            call.result()


HOLD_S = 12.0  # a stopping replica's drain: many times what a start of a trivial app takes, even on a loaded machine
HOLDER = """import time
import ember

app = ember.App("holding")


@app.function(min_replicas=1, max_replicas=1, timeout_s=60)
def hold(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
"""
NEWCOMER = """import ember

app = ember.App("newcomer")


@app.function(min_replicas=1)
def ping(x: int) -> int:
    return x
"""


def test_a_replica_that_drains_does_not_hold_up_the_starts_of_others(tmp_path, platform, transport, http):
    """The agent stops a replica in a task of its own: a start on the same node (another app's, here) does not wait
    for its drain, which only a start that needs the GPUs or host memory it holds would."""
    (tmp_path / "holding.py").write_text(HOLDER)
    (tmp_path / "newcomer.py").write_text(NEWCOMER)
    deploy(tmp_path / "holding.py", transport=transport, timeout_s=120)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(httpx.post, f"{platform.url}/v1/holding/hold", json=HOLD_S, timeout=60,
                           headers=bearer(platform.token))
        wait_for(lambda: _in_flight(http, "holding", "hold") >= 1, timeout_s=30, what="the call in flight")
        assert http.delete("/v1/apps/holding").status_code == 204  # its replica drains: the call holds it
        sent = time.monotonic()
        deploy(tmp_path / "newcomer.py", transport=transport, timeout_s=120)  # waits for its ready replica
        took = time.monotonic() - sent
        assert not held.done(), f"the new app's replica was ready only after the drain ({took:.1f}s)"
        answer = http.post("/v1/newcomer/ping", json=7)
        assert answer.status_code == 200 and answer.json() == 7
        assert held.result().status_code == 200  # and the drain let the call finish
    assert http.delete("/v1/apps/newcomer").status_code == 204


def _in_flight(http: httpx.Client, app: str = "wedge", service: str = "linger") -> int:
    services = http.get(f"/v1/apps/{app}").json()["services"]
    return sum(f["in_flight"] for s in services if s["name"] == service for r in s["replicas"]
               for f in r["functions"])


def _states(url: str, replica_ids: list[str]) -> set[str]:
    async def read() -> set[str]:
        nc = await admin_connect(url)
        try:
            kv = await nc.jetstream().key_value(subjects.REPLICAS_BUCKET)
            keys = {key.partition(".")[2]: key for key in await all_keys(kv)}  # <node id>.<replica id>
            states = set()
            for replica_id in replica_ids:
                try:
                    entry = await kv.get(keys[replica_id])
                except Exception:
                    states.add("gone")
                    continue
                states.add(msgspec.json.decode(entry.value or b"{}", type=ReplicaStatus).state)
            return states
        finally:
            await nc.close()

    return asyncio.run(read())


def test_a_bundle_uploaded_again_after_half_the_grace_is_stored_again(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EMBER_BUNDLE_GC_GRACE_S", "2")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "x.py").write_text("import ember\napp = ember.App('x')\n")
    bundle = build_bundle(tmp_path / "app")
    with TestPlatform(tmp_path / "state") as cluster:
        transport = Transport(cluster.url, token=cluster.token)
        try:
            path = f"/v1/bundles/{bundle.sha256}"
            assert transport.request("PUT", path, content=bundle.data).status_code == 201
            first = asyncio.run(_mtime(cluster.nats_url, bundle.sha256))
            assert transport.request("PUT", path, content=bundle.data).status_code == 200  # fresh: kept as it is
            assert asyncio.run(_mtime(cluster.nats_url, bundle.sha256)) == first
            time.sleep(1.5)  # past half the grace
            assert transport.request("PUT", path, content=bundle.data).status_code == 200
            assert asyncio.run(_mtime(cluster.nats_url, bundle.sha256)) != first  # written again: a fresh upload
        finally:
            transport.close()


async def _mtime(url: str, sha256: str) -> str:
    nc = await admin_connect(url)
    try:
        store = await nc.jetstream().object_store(subjects.BUNDLES_STORE)
        return str((await store.get_info(sha256)).mtime)
    finally:
        await nc.close()
