"""overlap="queue" and overlap="allow" on the real platform, the schedule CLI (``ember schedules``, ``ember
schedule pause|resume|run``) run as a user runs it, and the console's schedules in a real browser. Ordering and
counts only: no timing threshold."""

from __future__ import annotations

import math
import time

import httpx
import pytest
from support.browser import console_page
from support.paths import REPO
from support.polling import wait_for

from ember.wire import AppView
from ember.wire.schedules import tick_call_id

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
APP = REPO / "tests" / "apps" / "schedules" / "overlapping.py"


@pytest.fixture(scope="module")
def overlapping(deployed) -> AppView:
    return deployed(APP)


def _runs(http: httpx.Client, function: str, since: float = 0.0) -> list[tuple[str, str]]:
    """(start or end, call id) of ``function``'s runs from ``since`` on, in the order its replica printed them (every
    kept line: the default window's last 200 would cut a run's start from its end, or one of two ticks that started
    together from the other)."""
    got = http.get("/v1/apps/overlapping/logs",
                   params={"service": function, "stream": "stdout", "since": since, "limit": 5000}).json()
    return [(line["line"].split()[0].rsplit("-", 1)[1], line["line"].split()[1]) for line in got
            if len(line["line"].split()) == 2 and line["line"].startswith(f"{function}-")]


def _tick_of(function: str, since: float) -> dict[str, float]:
    """The tick each call id of ``function`` (a 1 s period) names, for the ticks from ``since`` to now."""
    return {tick_call_id("overlapping", function, float(t)): float(t)
            for t in range(math.floor(since), math.ceil(time.time()) + 2)}


def test_queue_runs_every_tick_in_order_one_at_a_time(overlapping, http):
    since = time.time() - 120
    wait_for(lambda: sum(what == "end" for what, _ in _runs(http, "queued")) >= 3, timeout_s=90,
             what="three runs of queued")
    runs = _runs(http, "queued")
    running = None
    for what, call_id in runs:  # never two at once: each start follows the end of the run before
        if what == "start":
            assert running is None, f"{call_id} started while {running} ran"
            running = call_id
        else:
            assert running == call_id
            running = None
    ticks = _tick_of("queued", since)
    started = [ticks[cid] for what, cid in runs if what == "start"]
    assert len(started) == len(set(started)), "a tick ran twice"
    assert started == [started[0] + n for n in range(len(started))], \
        f"a tick waiting behind a 2.5 s run was skipped or ran out of order: {started}"
    assert 'ember_schedule_runs_total{app="overlapping",status="queued"}' in http.get("/metrics").text
    view = next(v for v in http.get("/v1/schedules", params={"app": "overlapping"}).json()
                if v["function"] == "queued")
    assert view["spec"]["overlap"] == "queue"


def test_allow_runs_every_tick_beside_the_run_before(overlapping, http):
    first = math.ceil(time.time()) + 1  # four ticks that fire after this moment: each must start, once
    window = {tick_call_id("overlapping", "allowed", float(first + n)): first + n for n in range(4)}

    def overlapped() -> bool:
        running: set[str] = set()
        for what, call_id in _runs(http, "allowed"):
            if what == "start" and running:
                return True
            (running.add if what == "start" else running.discard)(call_id)
        return False

    wait_for(overlapped, timeout_s=90, what="a run of allowed starting while another ran")

    # Ticks that came together (a loaded machine) are queued together, and need not start in their order: each of
    # them starts in the end, none is skipped. A run starts after its tick, so the lines from a second before the
    # window's first tick hold every start the window's ticks can have.
    def window_started() -> list[str] | None:
        got = [cid for what, cid in _runs(http, "allowed", since=first - 1) if what == "start" and cid in window]
        return got if set(got) == set(window) else None

    ran = wait_for(window_started, timeout_s=60, what=f"a run of each of the ticks {sorted(window.values())}")
    assert len(ran) == len(set(ran)), f"a tick ran twice: {sorted(window[cid] for cid in ran)}"
    metrics = http.get("/metrics").text
    assert 'ember_schedule_runs_total{app="overlapping",status="skipped"}' not in metrics
    assert 'ember_schedule_lag_seconds_count{app="overlapping"}' in metrics  # a tick's start was seen


def test_the_schedule_cli_lists_pauses_runs_now_and_resumes(overlapping, ember_cli, platform, http):
    listed = ember_cli("schedules", "overlapping", url=platform.url).stdout
    assert "overlapping.allowed" in listed and "overlapping.queued" in listed and "every 1 seconds" in listed
    assert "UTC" in listed  # the next run, in UTC beside this machine's zone
    everything = ember_cli("schedules", url=platform.url).stdout
    assert "overlapping.queued" in everything

    paused = ember_cli("schedule", "pause", "overlapping.allowed", url=platform.url).stdout
    assert "overlapping.allowed: paused" in paused
    line = next(row for row in ember_cli("schedules", "overlapping", url=platform.url).stdout.splitlines()
                if row.startswith("overlapping.allowed"))
    assert line.rstrip().endswith("yes") and "paused" in line
    assert http.get("/v1/schedules", params={"app": "overlapping"}).json()[0]["paused"]

    ran = ember_cli("schedule", "run", "overlapping.allowed", url=platform.url).stdout
    call_id = ran.split("queued ", 1)[1].split()[0]
    assert http.get(f"/v1/calls/{call_id}", params={"wait": 30}).json()["status"] == "succeeded"
    assert call_id in [cid for what, cid in _runs(http, "allowed") if what == "start"]

    resumed = ember_cli("schedule", "resume", "overlapping.allowed", url=platform.url).stdout
    assert "overlapping.allowed: resumed, next run" in resumed
    assert not http.get("/v1/schedules", params={"app": "overlapping"}).json()[0]["paused"]

    missing = ember_cli("schedule", "pause", "overlapping.nope", url=platform.url, check=False)
    assert missing.returncode != 0 and "nope" in missing.stderr
    other = http.post("/v1/tokens", json={"name": "cli-other", "scopes": ["read", "deploy"],
                                          "apps": ["other-*"]}).json()["token"]
    assert ember_cli("schedules", url=platform.url, token=other).stdout.strip() == "no scheduled functions"
    refused = ember_cli("schedule", "run", "overlapping.allowed", url=platform.url, token=other, check=False)
    assert refused.returncode != 0


def test_the_console_shows_the_schedules(overlapping, platform, http):
    with console_page() as (page, problems):
        wait_for(lambda: all(v["last_tick"] for v in http.get("/v1/schedules", params={"app": "overlapping"}).json()),
                 timeout_s=30, what="a tick of each schedule")
        page.goto(f"{platform.url}/ui#token={platform.token}")
        row = '#schedules tr[data-schedule="overlapping.queued"]'
        page.wait_for_selector(row, timeout=30_000)
        assert page.inner_text(f"{row} td.words") == "every 1 seconds"
        assert "UTC" in page.inner_text(f"{row} td.next")
        page.wait_for_function(f"() => /fired|queued/.test(document.querySelector('{row} td.last').textContent)",
                               timeout=30_000)
        assert page.inner_text(f"{row} td.is-paused") == "no"

        assert http.post("/v1/apps/overlapping/schedules/queued/pause").status_code == 200
        try:
            page.wait_for_function(f"() => document.querySelector('{row} td.is-paused').textContent === 'yes'",
                                   timeout=30_000)
            assert page.inner_text(f"{row} td.next") == "paused"
        finally:
            assert http.post("/v1/apps/overlapping/schedules/queued/resume").status_code == 200
    assert problems == []  # no script error and no Content-Security-Policy violation
