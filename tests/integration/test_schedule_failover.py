"""A 1 s schedule across a SIGKILL of the control plane holding the lease: a standby takes over from the tick kept in
``ember_schedules``, runs each missed tick once (catch_up="all"), and no tick runs twice, even the one the killed
holder had just queued. Ordering and counts only."""

from __future__ import annotations

import contextlib
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
from ember.wire.schedules import tick_call_id

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
APP = REPO / "tests" / "apps" / "schedules" / "every_second.py"


def test_a_standby_runs_each_tick_once_after_the_lease_holder_is_killed(tmp_path: Path):
    with TestPlatform(tmp_path / "state") as cluster, authed_client(cluster, base_url="", timeout=30) as http:
        first, second = cluster.url, cluster.add_control_plane("platform-b")
        transport = Transport(first, token=cluster.token)
        deploy(APP, transport=transport, timeout_s=120)
        transport.close()
        since = time.time() - 60

        def beats(url: str) -> list[str]:
            lines = http.get(f"{url}/v1/apps/every-second/logs", params={"stream": "stdout", "limit": 5000}).json()
            return [line["line"].split()[1] for line in lines if line["line"].startswith("beat ")]

        wait_for(lambda: len(beats(first)) >= 3, timeout_s=90, what="three ticks before the kill")
        cluster.kill("platform")
        killed_at = time.time()
        wait_for(lambda: http.get(f"{second}/v1/status").json()["active"], timeout_s=30,
                 what="the standby to take over")

        def ticks() -> dict[str, float]:
            return {tick_call_id("every-second", "beat", float(t)): float(t)
                    for t in range(math.floor(since), math.ceil(time.time()) + 2)}

        def ran() -> list[float]:
            known = ticks()
            return sorted(known[cid] for cid in beats(second) if cid in known)

        wait_for(lambda: ran() and ran()[-1] > killed_at + 2, timeout_s=60, what="ticks after the takeover")
        run_ids = beats(second)
        assert len(run_ids) == len(set(run_ids)), "a tick ran twice"
        known = ticks()
        runs = sorted(known[cid] for cid in run_ids if cid in known)  # of the same lines (more may come meanwhile)
        assert len(runs) == len(run_ids), "a run that is no tick's"
        assert runs[0] < killed_at < runs[-1]
        missing = sorted(set(range(int(runs[0]), int(runs[-1]) + 1)) - {int(t) for t in runs})
        assert not missing, f"ticks skipped across the takeover (catch_up='all' runs them all): {missing}"
        view = httpx.get(f"{second}/v1/schedules", headers=http.headers).json()
        assert view[0]["function"] == "beat" and view[0]["runs"] >= 1


def test_a_schedule_paused_by_an_app_deleted_and_pushed_again_meanwhile_is_the_new_apps_own(tmp_path: Path):
    """The acting control plane stalls while an app whose schedule is paused is deleted and pushed again (the same
    code) through the standby: its schedule loop never saw the app go, so the paused state stayed in
    ``ember_schedules``. The standby, taking over, runs the new app's schedule: that state was another app's."""
    with TestPlatform(tmp_path / "state") as cluster, authed_client(cluster, base_url="", timeout=30) as http:
        first, second = cluster.url, cluster.add_control_plane("platform-b")
        with contextlib.closing(Transport(first, token=cluster.token)) as transport:
            deploy(APP, transport=transport, timeout_s=120)
        assert http.post(f"{first}/v1/apps/every-second/schedules/beat/pause").json()["paused"] is True

        cluster.pause("platform")  # the holder: its loops see neither the deletion nor the push
        assert http.delete(f"{second}/v1/apps/every-second").status_code == 204
        with contextlib.closing(Transport(second, token=cluster.token)) as transport:
            deploy(APP, transport=transport, wait=False)
        cluster.kill("platform")
        killed_at = time.time()
        wait_for(lambda: http.get(f"{second}/v1/status").json()["active"], timeout_s=30, what="the takeover")

        def beat() -> dict:
            (view,) = http.get(f"{second}/v1/schedules", params={"app": "every-second"}).json()
            return view

        def ticking() -> bool:
            view = beat()
            return not view["paused"] and view["last_status"] == "fired" and view["last_tick"] > killed_at

        wait_for(ticking, timeout_s=60, what="the new app's schedule to fire", explain=lambda: f"it is {beat()}")
