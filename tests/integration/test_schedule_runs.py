"""Scheduled functions on the real platform: each tick runs once (its call id names the tick), a slow function's
ticks are skipped while its run still runs (overlap="skip"), pause, resume and run now, and what a token that does
not see the app is shown. Ordering and counts only: no timing threshold."""

from __future__ import annotations

import itertools
import math
import time

import httpx
import pytest
from support.paths import REPO
from support.polling import wait_for

from ember.wire import AppView
from ember.wire.schedules import tick_call_id

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
APP = REPO / "tests" / "apps" / "schedules" / "ticking.py"


@pytest.fixture(scope="module")
def ticking(deployed) -> AppView:
    return deployed(APP)


def _lines(http: httpx.Client, service: str) -> list[tuple[str, str]]:
    """(what, call id) of the app's printed lines of ``service``, oldest first."""
    got = http.get("/v1/apps/ticking/logs", params={"service": service, "stream": "stdout", "limit": 5000}).json()
    return [tuple(line["line"].split()[:2]) for line in got if len(line["line"].split()) == 2]  # type: ignore[misc]


def _ticks(app: str, function: str, since: float) -> dict[str, float]:
    """The call id of each tick of a 1 s period from ``since`` to now."""
    return {tick_call_id(app, function, float(t)): float(t) for t in range(math.floor(since) - 1,
                                                                           math.ceil(time.time()) + 2)}


def _view(http: httpx.Client, function: str) -> dict:
    views = http.get("/v1/schedules", params={"app": "ticking"}).json()
    return next(v for v in views if v["function"] == function)


def test_each_tick_runs_once_and_a_slow_run_makes_the_next_ticks_skip(ticking, http):
    since = time.time() - 120
    wait_for(lambda: sum(w == "beat" for w, _ in _lines(http, "beat")) >= 3, timeout_s=90, what="three beats")
    beats = [cid for w, cid in _lines(http, "beat") if w == "beat"]
    ticks = _ticks("ticking", "beat", since)
    assert len(beats) == len(set(beats)), "a tick ran twice"
    assert all(cid in ticks for cid in beats[:3]), "a run that is not a tick's"

    wait_for(lambda: sum(w == "slow-end" for w, _ in _lines(http, "slow")) >= 2, timeout_s=90, what="two slow runs")
    lines = _lines(http, "slow")
    running = None
    for what, cid in lines:  # never two runs at once: each start follows the end of the run before
        if what == "slow-start":
            assert running is None, f"{cid} started while {running} ran"
            running = cid
        elif what == "slow-end":
            assert running == cid
            running = None
    slow_ticks = _ticks("ticking", "slow", since)
    started = [slow_ticks[cid] for w, cid in lines if w == "slow-start" and cid in slow_ticks]
    assert len(started) >= 2 and any(b - a > 1 for a, b in itertools.pairwise(started)), \
        "no tick was skipped while a 2.5 s run ran on a 1 s period"
    metrics = http.get("/metrics").text
    assert 'ember_schedule_runs_total{app="ticking",status="skipped"}' in metrics
    view = _view(http, "slow")
    assert view["schedule"] == "every 1 seconds" and view["spec"]["overlap"] == "skip" and view["runs"] >= 2


def test_pause_stops_the_ticks_run_now_runs_once_and_resume_goes_on(ticking, http):
    wait_for(lambda: any(w == "beat" for w, _ in _lines(http, "beat")), timeout_s=90, what="a beat")
    paused = http.post("/v1/apps/ticking/schedules/beat/pause")
    assert paused.status_code == 200 and paused.json()["paused"] and paused.json()["next_run"] == 0
    last = _view(http, "beat")["last_call_id"]  # the last tick fired before the pause: let it finish
    assert http.get(f"/v1/calls/{last}", params={"wait": 30}).json()["status"] == "succeeded"

    first = http.post("/v1/apps/ticking/schedules/beat/run")
    assert first.status_code == 202
    first_id = first.json()["call_id"]
    assert http.get(f"/v1/calls/{first_id}", params={"wait": 30}).json()["status"] == "succeeded"
    time.sleep(3)  # three ticks pass while paused (none may run)
    second_id = http.post("/v1/apps/ticking/schedules/beat/run").json()["call_id"]
    assert http.get(f"/v1/calls/{second_id}", params={"wait": 30}).json()["status"] == "succeeded"
    view = _view(http, "beat")
    assert view["paused"] and view["last_call_id"] == second_id and view["last_status"] == "run"

    def between() -> list[str]:
        beats = [cid for w, cid in _lines(http, "beat") if w == "beat"]
        return beats[beats.index(first_id) + 1:beats.index(second_id)]

    wait_for(lambda: second_id in [cid for _, cid in _lines(http, "beat")], timeout_s=20, what="the second run's line")
    assert between() == [], "a tick ran while the schedule was paused"

    resumed = http.post("/v1/apps/ticking/schedules/beat/resume").json()
    assert not resumed["paused"] and resumed["next_run"] > 0
    ticks = _ticks("ticking", "beat", time.time() - 5)

    def after() -> list[str]:
        beats = [cid for w, cid in _lines(http, "beat") if w == "beat"]
        return [cid for cid in beats[beats.index(second_id) + 1:] if cid in _ticks("ticking", "beat", time.time() - 60)]

    wait_for(lambda: len(after()) >= 2, timeout_s=30, what="ticks after the resume")
    resumed_ticks = sorted(_ticks("ticking", "beat", time.time() - 60)[cid] for cid in after())
    assert min(resumed_ticks) >= min(ticks.values()), "a tick that passed while paused ran after the resume"


def test_schedule_routes_refuse_what_is_not_there_and_hide_other_apps(ticking, http, platform):
    assert http.post("/v1/apps/ticking/schedules/nope/pause").status_code == 404
    assert http.post("/v1/apps/ticking/schedules/bad name/run").status_code == 400
    assert http.post("/v1/apps/no-such-app/schedules/beat/resume").status_code == 404
    assert http.get("/v1/schedules", params={"app": "Not An App"}).json()["error"]["field"] == "app"
    other = http.post("/v1/tokens", json={"name": "other", "scopes": ["read", "deploy"], "apps": ["other-*"]}).json()
    with httpx.Client(base_url=platform.url, headers={"Authorization": f"Bearer {other['token']}"}) as them:
        assert them.get("/v1/schedules").json() == []
        assert them.post("/v1/apps/ticking/schedules/beat/pause").status_code in (403, 404)
        assert "ticking" not in them.get("/metrics").text
