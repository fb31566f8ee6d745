"""A node writes the statuses of its own replicas only: under its own keys (``<node id>.<replica id>``, its NATS
permissions), and the control plane counts a status only for a replica the scheduler assigned to that node.

A rogue node (its own, valid node credentials) tries to overwrite, remove and impersonate the session node's replicas
of ``hello``, and to invent a replica of its own for ``hello``; ``hello`` keeps its replicas, on their node, and
keeps answering. The positive twin is the session node itself, whose replica's status is shown as ever.
"""

from __future__ import annotations

import asyncio
import gc
import time

import msgspec
import nats
import pytest
from support.polling import wait_for

from ember.wire import ReplicaStatus, subjects
from ember.wire.natscreds import read_file

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
ROGUE = "rogue-node"


def _status(replica_id: str, node_id: str, state: str = "crashed") -> bytes:
    now = time.time()
    return msgspec.json.encode(ReplicaStatus(replica_id=replica_id, node_id=node_id, app="hello", service="default",
                                             version=1, state=state, pid=1, started_at=now, updated_at=now,
                                             message="FORGED"))  # type: ignore[arg-type]


async def _as_rogue(url: str, options: dict, victim: str, victim_node: str) -> dict[str, str]:
    """Each attempt's outcome: the server's permissions violation, or "no error" (then the control plane judges)."""
    nc = await nats.connect(url, allow_reconnect=False, **options)
    seen: dict[str, str] = {}
    bucket = f"$KV.{subjects.REPLICAS_BUCKET}"
    attempts = {
        "overwrite its status": (f"{bucket}.{victim_node}.{victim}", _status(victim, victim_node), {}),
        "remove it": (f"{bucket}.{victim_node}.{victim}", b"", {"KV-Operation": "DEL"}),
        "write under the old key form": (f"{bucket}.{victim}", _status(victim, victim_node), {}),
        "claim it as its own": (f"{bucket}.{ROGUE}.{victim}", _status(victim, ROGUE), {}),
        "invent a replica": (f"{bucket}.{ROGUE}.hello-invented", _status("hello-invented", ROGUE, "ready"), {}),
        "remove it under its own key": (f"{bucket}.{ROGUE}.{victim}", b"", {"KV-Operation": "DEL"}),
    }
    try:
        for name, (subject, payload, headers) in attempts.items():
            nc._err = None
            await nc.publish(subject, payload, headers=headers or None)
            await nc.flush(timeout=5)
            await asyncio.sleep(0.3)
            seen[name] = repr(nc.last_error) if nc.last_error else "no error"
    finally:
        await nc.close()
    return seen


def test_a_node_cannot_report_remove_or_invent_another_nodes_replica(platform, http, hello):
    before = _replicas(http)
    victim = next(r for r in before if r["state"] == "ready")
    rogue = read_file(platform.node_credentials(ROGUE))
    seen = asyncio.run(_as_rogue(platform.nats_url, rogue.connect_options(), victim["replica_id"], victim["node_id"]))
    gc.collect()
    for refused in ("overwrite its status", "remove it", "write under the old key form"):
        assert "permissions violation" in seen[refused].lower(), (refused, seen[refused])
    for own_key in ("claim it as its own", "invent a replica", "remove it under its own key"):
        assert seen[own_key] == "no error", (own_key, seen[own_key])  # its own keys: the control plane judges

    # Judged and ignored: hello still has the replicas it had, on their own node, and answers.
    time.sleep(1.0)  # two control loop ticks: a status that waited for the assignments is judged by then
    now = _replicas(http)
    assert {(r["replica_id"], r["node_id"], r["state"]) for r in now} == {
        (r["replica_id"], r["node_id"], r["state"]) for r in before}
    assert not any(r["replica_id"] == "hello-invented" or r["node_id"] == ROGUE for r in now)
    assert http.post("/v1/hello/greet", json="x").json() == "Hello, x!"
    assert not any("FORGED" in (r.get("message") or "") for r in now)


def _replicas(http) -> list[dict]:
    return [r for s in http.get("/v1/apps/hello").json()["services"] for r in s["replicas"]]


def test_a_nodes_own_replica_reports_as_before(http, hello):
    """The positive twin: the session node's statuses of its replica (written under its key) are what is shown."""
    replica = wait_for(lambda: next((r for s in http.get("/v1/apps/hello").json()["services"]
                                     for r in s["replicas"] if r["state"] == "ready"), None),
                       timeout_s=60, what="hello's ready replica")
    assert replica["node_id"] and replica["replica_id"].startswith("hello-")
