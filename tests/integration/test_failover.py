"""Several control planes, one acting: the control lease in NATS KV, a standby taking over within seconds of a
SIGKILL, and the autoscaler's state rebuilt from what runs, not reset to ``min_replicas``."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path

import httpx
import pytest
from support.auth import authed_client, bearer
from support.natsconn import connect as admin_connect
from support.paths import EXAMPLES
from support.platform import TestPlatform
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy
from ember_platform.control.lease import Lease

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

APP = '''import ember
app = ember.App("steady")

@app.function(min_replicas=1, max_replicas=3)
def ping() -> str:
    return "pong"
'''


def test_one_lease_holder_at_a_time_and_a_dead_one_loses_it(platform):
    async def scenario() -> None:
        nc = await admin_connect(platform.nats_url)
        try:
            bucket = f"test_leases_{uuid.uuid4().hex[:8]}"
            a = Lease(nc.jetstream(), "a", ttl_s=1.5, bucket=bucket)
            b = Lease(nc.jetstream(), "b", ttl_s=1.5, bucket=bucket)
            assert await a.hold() and not await b.hold()
            assert await b.current() == "a"
            for _ in range(6):  # a renews: b never gets it
                await asyncio.sleep(0.3)
                assert await a.hold() and not await b.hold()
            # a stops renewing (as if SIGKILLed): its key expires with the bucket's TTL and b takes over
            deadline = time.monotonic() + 10
            while not await b.hold():
                assert time.monotonic() < deadline, "b never took the lease over"
                await asyncio.sleep(0.2)
            assert await b.current() == "b"
            assert not await a.hold() and not a.held  # a comes back: it lost it
            await b.release()  # a clean stop hands it over at once
            assert await a.hold()
            await nc.jetstream().delete_key_value(bucket)
        finally:
            await nc.close()

    asyncio.run(scenario())


def test_a_holder_stops_acting_before_its_key_can_expire(platform):
    """The holder counts its lease from when it sent the renewal (the bucket's TTL runs from when the server stored
    it), less a margin for a write begun just before: it never acts past the moment a standby may take over."""
    async def scenario() -> bool:
        nc = await admin_connect(platform.nats_url)
        try:
            bucket = f"test_leases_{uuid.uuid4().hex[:8]}"
            lease = Lease(nc.jetstream(), "a", ttl_s=1.2, bucket=bucket)
            assert await lease.hold() and lease.held
            await asyncio.sleep(1.05)  # of a 1.2 s lease: the key lives on a little, and the holder stops acting
            held = lease.held
            await nc.jetstream().delete_key_value(bucket)
            return held
        finally:
            await nc.close()

    assert not asyncio.run(scenario())


def test_a_standby_takes_over_within_seconds_and_keeps_the_replicas_that_run(tmp_path: Path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "steady.py").write_text(APP)
    with TestPlatform(tmp_path / "state") as cluster, authed_client(cluster, base_url="", timeout=30) as http:
        first = cluster.url
        second = cluster.add_control_plane("platform-b")

        def status(url: str) -> dict:
            return http.get(f"{url}/v1/status").json()

        holder = status(first)["control_plane"]
        assert holder and status(first)["active"]
        assert wait_for(lambda: status(second)["control_plane"] == holder and not status(second)["active"],
                        timeout_s=10, what="the second control plane to stand by")

        transport = Transport(first, token=cluster.token)
        deploy(tmp_path / "app" / "steady.py", transport=transport, timeout_s=120)
        # Three replicas running, above min_replicas=1 once the bounds come back down (the scale-down window,
        # 60 s by default, keeps them): what a freshly started autoscaler would cut straight back to 1.
        http.post(f"{first}/v1/apps/steady/scale", json={"service": "ping", "min_replicas": 3, "max_replicas": 3})
        wait_for(lambda: _ready(http, first) == 3, timeout_s=90, what="three ready replicas")
        http.post(f"{first}/v1/apps/steady/scale", json={"service": "ping", "min_replicas": 1, "max_replicas": 3})
        transport.close()

        cluster.kill("platform")
        killed_at = time.monotonic()
        wait_for(lambda: status(second)["active"], timeout_s=20, what="the standby to take over")
        took_over_s = time.monotonic() - killed_at
        assert status(second)["control_plane"] != holder
        print(f"the standby took over {took_over_s:.1f}s after the holder was killed")
        # The new holder places and scales: a new bound is applied, and calls go through it.
        assert http.post(f"{second}/v1/steady/ping").json() == "pong"
        time.sleep(3)  # several ticks of the new holder
        assert _ready(http, second) == 3, "the replicas that ran were dropped after the takeover"


def test_an_app_deleted_and_pushed_again_while_the_holder_stalled_serves_its_new_code(tmp_path: Path):
    """The acting control plane stalls while an app is deleted and pushed again through the standby: the new app is
    version 1 again, and the plan the standby takes over still has the old app's replica as version 1. It is found
    by its bundle and replaced: the old code never answers the new app's calls for good."""
    for name, answer in (("old", "pong"), ("new", "pong again")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "steady.py").write_text(APP.replace('return "pong"', f"return {answer!r}"))
    with TestPlatform(tmp_path / "state") as cluster, authed_client(cluster, base_url="", timeout=30) as http:
        first, second = cluster.url, cluster.add_control_plane("platform-b")
        wait_for(lambda: not http.get(f"{second}/v1/status").json()["active"], timeout_s=10, what="a standby")
        with contextlib.closing(Transport(first, token=cluster.token)) as transport:
            deploy(tmp_path / "old" / "steady.py", transport=transport, timeout_s=120)
        assert http.post(f"{first}/v1/steady/ping").json() == "pong"

        cluster.pause("platform")  # the holder: its control loop sees neither the deletion nor the push
        assert http.delete(f"{second}/v1/apps/steady").status_code == 204
        with contextlib.closing(Transport(second, token=cluster.token)) as transport:
            assert deploy(tmp_path / "new" / "steady.py", transport=transport, wait=False).version == 1
        cluster.kill("platform")
        wait_for(lambda: http.get(f"{second}/v1/status").json()["active"], timeout_s=20, what="the takeover")
        wait_for(lambda: http.post(f"{second}/v1/steady/ping").json() == "pong again", timeout_s=90,
                 what="the new app's code to answer")
        wait_for(lambda: _ready(http, second) == 1, timeout_s=30, what="the old app's replica to leave")
        assert {http.post(f"{second}/v1/steady/ping").json() for _ in range(10)} == {"pong again"}


def _ready(http: httpx.Client, url: str) -> int:
    services = http.get(f"{url}/v1/status", params={"app": "steady"}).json()["services"]
    return services[0]["ready"] if services else 0


def test_the_logs_outlive_a_restart_of_the_control_plane(tmp_path: Path):
    with TestPlatform(tmp_path / "state") as cluster:
        transport = Transport(cluster.url, token=cluster.token)
        deploy(EXAMPLES / "hello" / "hello.py", transport=transport, timeout_s=120)
        transport.close()
        auth = bearer(cluster.token)  # the same token after the restart: the control plane keeps its file
        greeting = httpx.post(f"{cluster.url}/v1/hello/greet", json="Logan", timeout=30, headers=auth)
        assert greeting.json() == "Hello, Logan!"

        def logged() -> bool:
            lines = httpx.get(f"{cluster.url}/v1/apps/hello/logs", params={"service": "greet"}, timeout=30,
                              headers=auth).json()
            return any("greeting Logan" in line["line"] for line in lines)

        wait_for(logged, timeout_s=20, what="the log line")
        cluster.restart_platform()
        assert logged(), "the control plane forgot the replicas' output when it restarted"
