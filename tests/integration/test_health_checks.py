"""``@ember.health`` on the real platform: a replica whose check raises, or does not return within its timeout, is
replaced, the new replica first, and every call made meanwhile is served; the old one then stops, running its
teardown."""

from __future__ import annotations

import httpx
import pytest
from support.browser import console_page
from support.paths import TEST_APPS
from support.polling import wait_for

from ember.wire import AppView

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def health_app(deployed) -> AppView:
    return deployed(TEST_APPS / "health" / "health.py")


def _stderr(http: httpx.Client, service: str) -> str:
    lines = http.get("/v1/apps/health/logs", params={"service": service, "limit": 5000}).json()
    return "\n".join(line["line"] for line in lines if line["stream"] == "stderr")


def _served_until_replaced(http: httpx.Client, model: str, old: str) -> list[int]:
    """Call ``model.who`` until another replica than ``old`` answers; the status of every call made."""
    statuses: list[int] = []

    def replaced() -> bool:
        answer = http.post(f"/v1/health/{model}.who", json={}, timeout=60)
        statuses.append(answer.status_code)
        return answer.status_code == 200 and answer.json() != old

    wait_for(replaced, timeout_s=90, every_s=0.2, what=f"a replica of {model} other than {old}")
    return statuses


@pytest.mark.parametrize(("model", "breaker", "said", "failures"), [
    ("Checked", "break_it", "its health check device_ok() raised RuntimeError: device lost under {old} (3 checks in a "
                            "row)", 3),
    ("Hung", "hang", "its health check alive() did not return within 1 s", 1),
])
def test_a_replica_whose_health_check_fails_is_replaced_and_no_call_fails(health_app, http, model, breaker, said,
                                                                          failures):
    old = http.post(f"/v1/health/{model}.{breaker}", json={}).json()
    statuses = _served_until_replaced(http, model, old)
    assert set(statuses) == {200}, statuses
    stderr = wait_for(lambda: said.format(old=old) in _stderr(http, model) and _stderr(http, model), timeout_s=30,
                      what="the reason on the replica's stderr")
    assert "this replica is being replaced" in stderr
    warned = [f"({n} of {failures} failures in a row before it gives way)" in stderr for n in range(1, failures)]
    assert warned == [True] * (failures - 1)  # each failure before the last is said, and forgiven
    counted = f'ember_replicas_replaced_total{{app="health",reason="health",service="{model}"}}'
    wait_for(lambda: counted in http.get("/metrics").text, timeout_s=30, what=f"{counted} in /metrics")


def test_the_replaced_replica_stops_and_runs_its_teardown(health_app, http, ember_cli, platform):
    old = http.post("/v1/health/Checked.who", json={}).json()
    http.post("/v1/health/Checked.break_it", json={})
    _served_until_replaced(http, "Checked", old)
    row = next(line for line in ember_cli("status", url=platform.url).stdout.splitlines()
               if line.startswith("health.Checked "))
    assert "replaced a replica at " in row and f"device_ok() raised RuntimeError: device lost under {old}" in row
    with console_page() as (page, problems):  # the console's apps table says it too
        page.goto(f"{platform.url}/ui#token={platform.token}")
        note = page.wait_for_selector('#apps tr[data-service="health.Checked"] td.note', timeout=30_000)
        assert note is not None
        assert "replaced a replica at " in note.inner_text() and f"device lost under {old}" in note.inner_text()
    assert problems == []

    def teardown_printed() -> bool:
        lines = http.get("/v1/apps/health/logs", params={"service": "Checked", "limit": 5000}).json()
        return any(line["line"] == f"teardown {old}" for line in lines)

    wait_for(teardown_printed, timeout_s=60, what=f"the teardown of {old}")
