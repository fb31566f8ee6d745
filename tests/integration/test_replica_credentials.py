"""A replica's NATS credentials expire and are renewed while it is assigned; once unassigned, it is cut off.

The JWT the auth callout issues for a replica expires (``exp``) ``EMBER_REPLICA_CREDENTIALS_TTL_S`` after it
connected; the replica reconnects at half that, so a short TTL here makes it renew every 1.5 s while it keeps
answering calls. A hostile replica's code hands its NATS user and password to a client outside the platform: once
the app is undeployed that client is refused, and the connection it opened before is kicked after the replica's
drain time (``EMBER_REPLICA_DRAIN_GRACE_S``), long before its own JWT would expire.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import nats
import pytest
from support.auth import authed_client
from support.paths import REPO
from support.platform import TestPlatform

import ember
from ember._client import Transport

pytestmark = [
    pytest.mark.integration,
    # nats-py leaves the socket of a refused connection for the garbage collector (an unclosed-transport warning)
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.usefixtures("collect_refused_sockets"),
]

INTRUDER = REPO / "tests" / "apps" / "intruder" / "intruder.py"
TTL_S = 3.0



def _deploy_intruder(platform: TestPlatform) -> None:
    transport = Transport(platform.url, token=platform.token)
    try:
        ember.deploy(INTRUDER, transport=transport, timeout_s=120)
    finally:
        transport.close()


def test_a_replica_keeps_answering_across_its_credentials_renewals(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_REPLICA_CREDENTIALS_TTL_S", str(TTL_S))
    with TestPlatform(tmp_path / "state") as platform, authed_client(platform) as http:
        _deploy_intruder(platform)
        until = time.monotonic() + 3 * TTL_S  # more than two TTLs: without renewal it would be cut at the first

        def keep_calling() -> list[int]:
            """Call after call until ``until``, each one's status (several callers: calls in flight at renewals)."""
            codes = []
            while time.monotonic() < until:
                started = time.monotonic()
                codes.append(http.post("/v1/intruder/credentials", json={}, timeout=60).status_code)
                time.sleep(max(0.0, started + 0.005 - time.monotonic()))  # a few ms apart, not flat out
            return codes

        with ThreadPoolExecutor(4) as pool:
            codes = [code for codes in pool.map(lambda _: keep_calling(), range(4)) for code in codes]
        assert codes and set(codes) == {200}, sorted(set(codes))
        seen = http.post("/v1/intruder/credentials", json={}, timeout=60).json()
        assert seen["reconnects"] >= 2, seen["reconnects"]  # it renewed (by reconnecting) while answering them all


def test_an_unassigned_replicas_credentials_are_refused_and_its_connections_cut(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_REPLICA_DRAIN_GRACE_S", "1")  # the JWT itself holds for an hour: only a kick cuts
    with TestPlatform(tmp_path / "state") as platform, authed_client(platform) as http:
        _deploy_intruder(platform)
        stolen = http.post("/v1/intruder/credentials", json={}, timeout=60).json()
        assert stolen["user"].startswith("replica.")
        assert asyncio.run(_held_then_cut(platform.nats_url, stolen, http)) == "cut"
        assert "Authorization" in asyncio.run(_try_connect(platform.nats_url, stolen))


async def _held_then_cut(url: str, stolen: dict, http: httpx.Client) -> str:
    """Connect with the stolen credentials while the replica is assigned (admitted: the owner's twin), undeploy
    the app, and wait for the server to close the connection (the kick; a reconnect is refused: ``_try_connect``)."""
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    nc = await nats.connect(url, user=stolen["user"], password=stolen["password"],
                            inbox_prefix=stolen["inbox_prefix"], allow_reconnect=False, closed_cb=on_closed,
                            connect_timeout=5)
    try:
        await nc.flush(timeout=5)
        assert nc.is_connected
        deleted = await asyncio.to_thread(http.delete, "/v1/apps/intruder")
        assert deleted.status_code == 204, deleted.text
        try:
            await asyncio.wait_for(closed.wait(), 60)
        except TimeoutError:
            return "still connected"
        return "cut"
    finally:
        await nc.close()


async def _try_connect(url: str, stolen: dict) -> str:
    """``connected`` or the refusal."""
    nc = nats.NATS()
    try:
        await nc.connect(url, user=stolen["user"], password=stolen["password"], allow_reconnect=False,
                         max_reconnect_attempts=0, connect_timeout=5)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await nc.close()  # a refused client's socket too
    return "connected"
