"""Another tenant's replica can neither list, read nor forge an app's calls, results and dead letters.

Each app's calls are kept under its own keys (``s.<app>.<id>``, ``r.<app>.<id>``, ``<app>.<id>...`` for large
outputs), and a replica's NATS permissions name only its own app's keys, read by key: no stream info, no message by
sequence, no delete. A hostile app (tests/apps/intruder) tries each from its own replica's connection; the victim's
call keeps its own output, and both apps still work (the positive twins).
"""

from __future__ import annotations

import pytest
from support.paths import REPO
from support.polling import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.usefixtures("collect_refused_sockets"),
]

REFUSED = ("list every app's calls", "read a record by sequence", "read another app's record",
           "find a record under any app", "read a record by its last subject", "forge another app's result",
           "forge another app's status", "write another app's large output", "read the large outputs",
           "list the stored chunks", "list the streams", "delete a dead letter",
           "publish into another client's inbox", "reply to another app's event requester",
           "put another app's replica on standby", "ask for a bundle as its node does")



def _finished(http, call_id: str) -> dict:
    return wait_for(lambda: (r := http.get(f"/v1/calls/{call_id}").json()).get("status") == "succeeded" and r,
                    timeout_s=60, what=f"call {call_id}")


def test_another_tenants_replica_cannot_list_read_or_forge_an_apps_calls(http, hello, deployed):
    deployed(REPO / "tests" / "apps" / "intruder" / "intruder.py")
    spawned = http.post("/v1/hello/greet/spawn", json="victim")
    assert spawned.status_code == 202, spawned.text
    call_id = spawned.json()["call_id"]
    assert call_id.startswith("hello_")  # the id names its app: the platform reads it under hello's keys only
    assert _finished(http, call_id)["output"] == "Hello, victim!"

    victim = next(r for s in http.get("/v1/apps/hello").json()["services"] for r in s["replicas"])
    seen = http.post("/v1/intruder/steal", json={"app": "hello", "call_id": call_id, "replica_id": victim["replica_id"],
                                                 "node_id": victim["node_id"]}, timeout=180).json()
    assert set(seen) == {*REFUSED, "write under its own app"}
    for attempt in REFUSED:
        answer = seen[attempt]
        assert "permissions violation" in answer.lower() or "Timeout" in answer, (attempt, answer)
        assert "no error" not in answer, (attempt, answer)
    assert seen["write under its own app"].startswith("no error"), seen["write under its own app"]

    # The victim's record is its own: the forged record the intruder wrote under its own app changes nothing.
    record = http.get(f"/v1/calls/{call_id}").json()
    assert record["app"] == "hello" and record["output"] == "Hello, victim!"


def test_an_apps_own_calls_work_beside_the_intruder(http, deployed):
    """The positive twin: the intruder's own spawned call is recorded, read and answered as any other."""
    deployed(REPO / "tests" / "apps" / "intruder" / "intruder.py")
    spawned = http.post("/v1/intruder/steal/spawn", json={"app": "intruder", "call_id": "intruder_" + "0" * 32})
    assert spawned.status_code == 202, spawned.text
    record = wait_for(lambda: (r := http.get(f"/v1/calls/{spawned.json()['call_id']}").json())["status"] in
                      ("succeeded", "failed") and r, timeout_s=120, what="the intruder's own call")
    assert record["status"] == "succeeded" and record["app"] == "intruder"
    # From its own replica, its own app's records are readable and writable by key (no violation).
    assert record["output"]["write under its own app"].startswith("no error")
