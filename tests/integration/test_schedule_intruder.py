"""Another tenant's replica, with its own credentials and NATS connection, against schedules and cancellation: it
can neither read, watch nor write ``ember_schedules`` (the control planes' bucket), nor publish on
``ember.control.cancelled`` (the control planes' relay subject) or another replica's cancel subject, nor publish or
hear ``ember.control.unserved`` (which functions a control plane's calls wait for); the victim's schedule and
running call are untouched."""

from __future__ import annotations

import time

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
    assert len(seen) == 10
    for attempt, answer in seen.items():
        assert "permissions violation" in answer.lower(), (attempt, answer)
    done = http.get(f"/v1/calls/{call_id}", params={"wait": 30}).json()
    assert done["status"] == "succeeded" and not done.get("cancelled_by"), done
    view = next(v for v in http.get("/v1/schedules", params={"app": "ticking"}).json() if v["function"] == "slow")
    assert not view["paused"] and view["last_tick"] > 1.0


def test_another_tenants_replica_cannot_end_a_run_for_the_schedule_loop(deployed, http):
    """A replica may write its own app's call records, any id after its app's key: one naming the victim's running
    tick must not tell the loop that the run ended (its overlap="skip" would fire the next tick beside it)."""
    deployed(REPO / "tests" / "apps" / "schedules" / "ticking.py")
    deployed(REPO / "tests" / "apps" / "intruder" / "intruder.py")  # with a schedule: its records are watched too

    def slow() -> dict:
        return next(v for v in http.get("/v1/schedules", params={"app": "ticking"}).json() if v["function"] == "slow")

    def running_tick() -> str | None:
        view = slow()
        if view["last_status"] != "fired" or not view["last_call_id"]:
            return None
        status = http.get(f"/v1/calls/{view['last_call_id']}").json()["status"]
        return view["last_call_id"] if status == "running" else None

    first = wait_for(running_tick, timeout_s=90, every_s=0.05, what="a tick's run of the slow function")
    seen = http.post("/v1/intruder/forge_ended", json={"call_id": first}, timeout=60).json()
    assert seen["say another app's call ended"].startswith("no error"), seen  # its own key: written
    while True:  # no tick fires beside the run until it ends (2.5 s on a 1 s period)
        last = slow()["last_call_id"]
        status = http.get(f"/v1/calls/{first}").json()["status"]  # read after the view
        if last != first:
            assert status in ("succeeded", "failed", "cancelled"), f"{last} fired while {first} was {status}"
            break
        if status != "running":
            break
        time.sleep(0.05)
