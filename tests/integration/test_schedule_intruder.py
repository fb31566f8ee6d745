"""Another tenant's replica, with its own credentials and NATS connection, against schedules and cancellation: it
can neither read, watch nor write ``ember_schedules`` (the control planes' bucket), nor publish on
``ember.control.cancelled`` (the control planes' relay subject) or another replica's cancel subject; the victim's
schedule and running call are untouched."""

from __future__ import annotations

import pytest
from support.paths import REPO
from support.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
              pytest.mark.usefixtures("collect_refused_sockets")]


def test_another_tenants_replica_cannot_touch_schedules_nor_cancel_a_call(deployed, http):
    deployed(REPO / "tests" / "apps" / "schedules" / "ticking.py")
    deployed(REPO / "tests" / "apps" / "intruder" / "intruder.py")
    call_id = http.post("/v1/apps/ticking/schedules/slow/run").json()["call_id"]  # runs 2.5 s
    running = wait_for(lambda: (r := http.get(f"/v1/calls/{call_id}").json())["status"] == "running" and r,
                       timeout_s=60, what="the victim's call to run")
    victim = {"app": "ticking", "function": "slow", "call_id": call_id, "replica": running["replica"]}
    seen = http.post("/v1/intruder/meddle", json=victim, timeout=120).json()
    assert len(seen) == 8
    for attempt, answer in seen.items():
        assert "permissions violation" in answer.lower(), (attempt, answer)
    done = http.get(f"/v1/calls/{call_id}", params={"wait": 30}).json()
    assert done["status"] == "succeeded" and not done.get("cancelled_by"), done
    view = next(v for v in http.get("/v1/schedules", params={"app": "ticking"}).json() if v["function"] == "slow")
    assert not view["paused"] and view["last_tick"] > 1.0
