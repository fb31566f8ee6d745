"""Ember on a three-server NATS cluster: every stream, bucket and object store replicated three times, and the
platform, its node agent and replicas carrying on when one server is SIGKILLed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from support.nats_cluster import NatsCluster
from support.natsconn import connect as admin_connect
from support.paths import EXAMPLES
from support.polling import wait_for

import ember
from ember._client import Transport
from ember._deploy import deploy
from ember.wire import subjects
from ember.wire.jetstream import StorageLimits, apply_limits, ensure_buckets, kv_stream, object_stream

pytestmark = [
    pytest.mark.integration, pytest.mark.timeout(420),
    # A client whose connection attempt met a server still starting (or refused, before a control plane answers
    # the auth callout) leaves its socket to the garbage collector: nats-py's, not a leak of Ember's.
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

STREAMS = [subjects.CALLS_STREAM, subjects.DEAD_STREAM, kv_stream(subjects.CALLS_BUCKET),
           kv_stream(subjects.DEPLOYMENTS_BUCKET), kv_stream(subjects.ASSIGNMENTS_BUCKET),
           kv_stream(subjects.NODES_BUCKET), kv_stream(subjects.REPLICAS_BUCKET),
           object_stream(subjects.BUNDLES_STORE), kv_stream(subjects.RESULTS_BUCKET), subjects.LOGS_STREAM]


def test_ember_survives_losing_one_nats_server_of_three(tmp_path: Path):
    env = {"EMBER_JS_REPLICAS": "3", "EMBER_ACK_WAIT_S": "3"}
    token_file = tmp_path / "token"  # the control plane writes an admin token here, first
    with NatsCluster(tmp_path / "nats") as cluster, httpx.Client(timeout=60) as http:
        url_file = tmp_path / "platform.url"
        cluster.spawn("platform", ["-m", "ember_platform", "--nats", cluster.url, "--port", "0",
                                   "--url-file", str(url_file), "--bootstrap-token-file", str(token_file)], env)
        cluster.spawn("agent", ["-m", "ember_runtime", "--nats", cluster.url, "--state-dir", str(tmp_path / "node")],
                      env)
        url = wait_for(lambda: url_file.exists() and url_file.read_text(), timeout_s=120, what="the control plane",
                       explain=lambda: (tmp_path / "nats" / "platform.log").read_text()[-3000:])
        wait_for(lambda: http.get(f"{url}/readyz").status_code == 200, timeout_s=60, what="readyz")
        token = token_file.read_text().strip()
        http.headers["Authorization"] = f"Bearer {token}"
        transport = Transport(url, token=token)
        try:  # a busy machine (a full suite on two cores) once took over 120 s; the logs say what it waited on
            deploy(EXAMPLES / "hello" / "hello.py", transport=transport, timeout_s=240)
        except ember.UnavailableError as exc:
            raise AssertionError(f"{exc}\n--- agent.log:\n{(tmp_path / 'nats' / 'agent.log').read_text()[-4000:]}"
                                 f"\n--- platform.log:\n{(tmp_path / 'nats' / 'platform.log').read_text()[-3000:]}"
                                 ) from exc
        finally:
            transport.close()
        assert http.post(f"{url}/v1/hello/greet", json="Ada").json() == "Hello, Ada!"

        replicas = asyncio.run(_replicas(cluster.url))
        assert replicas == dict.fromkeys(STREAMS, 3)

        before = http.post(f"{url}/v1/hello/greet/spawn", json="Before").json()["call_id"]
        cluster.kill(0)

        def served() -> bool:
            try:
                return http.post(f"{url}/v1/hello/greet", json="Grace").json() == "Hello, Grace!"
            except (httpx.HTTPError, ValueError):
                return False

        wait_for(served, timeout_s=60, what="a synchronous call after losing a server")
        after = wait_for(lambda: _spawned(http, url, "After"), timeout_s=60, what="a spawn after losing a server")
        for call_id, name in ((before, "Before"), (after, "After")):
            record = http.get(f"{url}/v1/calls/{call_id}", params={"wait": 60}).json()
            assert (record["status"], record["output"]) == ("succeeded", f"Hello, {name}!"), \
                (record["status"], record.get("error"), record.get("attempts"))  # what failed it, in full


def _spawned(http: httpx.Client, url: str, name: str) -> str | None:
    """The new call's id; None after a clear 503 (the stream's leader moving to a live server), to retry."""
    response = http.post(f"{url}/v1/hello/greet/spawn", json=name, headers={"Idempotency-Key": f"spawn-{name}"})
    if response.status_code == 503:
        assert response.headers.get("Retry-After") and response.json()["error"]["code"] == "unavailable"
        return None
    assert response.status_code == 202, response.text
    return str(response.json()["call_id"])


async def _replicas(url: str) -> dict[str, int]:
    nc = await admin_connect(servers=url.split(","))
    try:
        js = nc.jetstream()
        return {name: (await js.stream_info(name)).config.num_replicas or 1 for name in STREAMS}
    finally:
        await nc.close()


def test_an_installation_grown_from_one_server_to_three_gets_three_copies_of_everything(tmp_path: Path,
                                                                                          monkeypatch):
    """EMBER_JS_REPLICAS is read when a stream is created: streams made by a single-server installation kept one
    copy after it moved to a cluster, and losing that server lost them. The platform's start brings them to three."""
    async def run() -> tuple[dict[str, int], dict[str, int]]:
        nc = await admin_connect(cluster.url)
        try:
            js = nc.jetstream()
            monkeypatch.setenv("EMBER_JS_REPLICAS", "1")
            await ensure_buckets(js)  # as the single server's installation made them
            before = {name: (await js.stream_info(name)).config.num_replicas or 1 for name in STREAMS}
            monkeypatch.setenv("EMBER_JS_REPLICAS", "3")
            await apply_limits(js, StorageLimits())
            after = {name: (await js.stream_info(name)).config.num_replicas or 1 for name in STREAMS}
            return before, after
        finally:
            await nc.close()

    with NatsCluster(tmp_path / "nats") as cluster:
        before, after = asyncio.run(run())
    assert set(before.values()) == {1}
    assert after == dict.fromkeys(STREAMS, 3)
