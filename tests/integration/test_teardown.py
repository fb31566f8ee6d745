"""``@ember.teardown`` on the real platform: when a new version replaces a replica, the replica finishes the call it
holds, then runs its model's teardown methods (a failing one is printed, the others still run), and exits as a
replica that was stopped, not one that crashed."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
from support.paths import REPO
from support.polling import wait_for

from ember._deploy import deploy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
APP = REPO / "tests" / "apps" / "teardown" / "teardown.py"


def _lines(http: httpx.Client, service: str) -> list[str]:
    got = http.get("/v1/apps/teardown/logs", params={"service": service, "limit": 5000}).json()
    return [f"{line['stream']} {line['line']}" for line in got]


def test_a_replaced_replica_finishes_its_call_then_tears_down(transport, http, tmp_path):
    deploy(APP, transport=transport, timeout_s=120)
    changed = tmp_path / "teardown.py"  # the same app, another bundle: a push of the same one changes nothing
    changed.write_text(APP.read_text() + "\n# the second version\n")
    resource = http.post("/v1/teardown/Held.work", json=0).json()
    faulty = http.post("/v1/teardown/Faulty.ping", json={}).json()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(http.post, "/v1/teardown/Held.work", json=6, timeout=60)
        wait_for(lambda: _lines(http, "Held").count(f"stdout work-start {resource}") == 2, timeout_s=30,
                 what="the second call to start")
        deploy(changed, transport=transport, timeout_s=120)  # a new version: the first version's replicas stop
        answer = held.result()
    assert answer.status_code == 200 and answer.json() == resource  # served where it began, not retried elsewhere

    wait_for(lambda: f"stdout teardown {resource}" in _lines(http, "Held"), timeout_s=60, what="Held's teardown",
             explain=lambda: "\n".join(_lines(http, "Held")))
    lines = _lines(http, "Held")
    assert lines.index(f"stdout work-end {resource}") < lines.index(f"stdout teardown {resource}")
    assert lines.count(f"stdout teardown {resource}") == 1

    wait_for(lambda: f"stdout teardown-after {faulty}" in _lines(http, "Faulty"), timeout_s=60,
             what="Faulty's second teardown, past the first's failure")
    stderr = "\n".join(line for line in _lines(http, "Faulty") if line.startswith("stderr "))
    assert "teardown broken() failed" in stderr and f"RuntimeError: cannot close {faulty}" in stderr
    stopped = [line for line in _lines(http, "Held") + _lines(http, "Faulty") if line.startswith("agent ")]
    assert not any("crash" in line or "exited with code" in line for line in stopped), stopped
