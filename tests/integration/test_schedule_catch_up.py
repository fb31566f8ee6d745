"""catch_up after the control plane was down (SIGKILL, then a start on the same state), with a real nats-server:
with "latest" the most recent missed tick runs once and the ticks before it do not; with "none" a tick handled more
than ``ON_TIME_S`` after its time does not run. Ordering and counts only: the one wait that matters (the control
plane stays down past a tick by more than ``ON_TIME_S``) is arranged, then checked, never assumed."""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx
import pytest
from support.auth import authed_client
from support.paths import REPO
from support.platform import TestPlatform
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy
from ember.wire.schedules import ON_TIME_S, tick_call_id

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
APP = REPO / "tests" / "apps" / "schedules" / "catching_up.py"
PERIOD_S = 30.0  # the period of "latest" and "none" in the app (tests/apps/schedules/catching_up.py): the restart,
# down past a tick by ON_TIME_S, then up again, ends well before the next


def _views(http: httpx.Client) -> dict[str, dict]:
    return {v["function"]: v for v in http.get("/v1/schedules", params={"app": "catching-up"}).json()}


def _queued(http: httpx.Client, function: str, tick: float) -> bool:
    """Whether ``tick`` of ``function`` was queued (its call has a record)."""
    found = http.get(f"/v1/calls/{tick_call_id('catching-up', function, tick)}")
    assert found.status_code in (200, 404), found.text
    return found.status_code == 200


def test_latest_runs_the_last_missed_tick_and_none_runs_none(tmp_path: Path):
    with TestPlatform(tmp_path / "state") as cluster, authed_client(cluster, base_url=cluster.url, timeout=30) as http:
        transport = Transport(cluster.url, token=cluster.token)
        deploy(APP, transport=transport, timeout_s=120)
        transport.close()
        wait_for(lambda: all(v["last_tick"] for v in _views(http).values()) and len(_views(http)) == 3,
                 timeout_s=60, what="the three schedules seen by the loop")
        wait_for(lambda: _views(http)["often"]["runs"] >= 2, timeout_s=30, what="two ticks of often")

        tick = math.ceil(time.time() / PERIOD_S) * PERIOD_S  # the tick the control plane will be down for
        if tick - time.time() < 3:
            tick += PERIOD_S
        time.sleep(max(0.0, tick - 2 - time.time()))
        cluster.kill("platform")
        killed_at = time.time()
        time.sleep(max(0.0, tick + ON_TIME_S + 2 - time.time()))  # down past the tick by more than ON_TIME_S
        cluster.start_platform()
        wait_for(lambda: _views(http)["often"]["last_tick"] > killed_at + ON_TIME_S, timeout_s=60,
                 what="the restarted control plane's first ticks")

        views = _views(http)
        assert time.time() < tick + PERIOD_S, "the restart took a whole period: the test cannot tell the policies apart"
        assert views["none"]["last_status"] == "missed" and views["none"]["last_tick"] == tick
        assert not _queued(http, "none", tick), "catch_up='none' ran a tick handled after the downtime"
        assert views["latest"]["last_tick"] == tick and views["latest"]["last_status"] == "fired"
        assert _queued(http, "latest", tick), "catch_up='latest' did not run the tick missed while down"

        ran = [t for t in range(math.ceil(killed_at), int(views["often"]["last_tick"]) + 1)
               if _queued(http, "often", t)]
        assert ran and ran[0] - killed_at > ON_TIME_S, f"ticks of the downtime ran (catch_up='latest'): {ran[:5]}"
        assert ran == list(range(ran[0], ran[-1] + 1)), f"a tick after the restart was skipped: {ran}"
        assert 'ember_schedule_runs_total{app="catching-up",status="missed"}' in http.get("/metrics").text
