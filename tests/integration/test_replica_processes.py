"""What a replica does with its process must not wedge it or outlive it: an output line far over a pipe's buffer
is read (and cut in the logs), and the processes a replica started stop with it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.paths import TEST_APPS
from support.polling import wait_for
from support.procs import gone

from ember._deploy import deploy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_a_huge_output_line_neither_wedges_the_replica_nor_floods_the_logs(deployed, http):
    deployed(TEST_APPS / "wedge" / "wedge.py")
    for _ in range(3):  # a reader that gave up on the first line would leave the pipe full by the second
        response = http.post("/v1/wedge/shout", json=300_000, headers={"X-Ember-Timeout": "20"})
        assert response.status_code == 200, response.text
        assert response.json() == 300_000

    def cut_lines() -> list[str]:
        lines = http.get("/v1/apps/wedge/logs", params={"service": "shout"}).json()
        return [x["line"] for x in lines if "more bytes of this line not kept" in x["line"]]

    lines = wait_for(lambda: len(cut_lines()) >= 3 and cut_lines(), timeout_s=30, what="the cut log lines")
    assert all(len(line) < 20_000 for line in lines)


def _on_node(pid: int, replicas: set[int]) -> int:
    """The pid on this node of the process that one of ``replicas`` (pids on the node) knows as ``pid``: in a
    sandbox, a replica and what it starts have pids of the sandbox's own."""
    for entry in Path("/proc").iterdir():
        try:
            status = dict(line.split(":", 1) for line in (entry / "status").read_text().splitlines() if ":" in line)
        except (OSError, ValueError):
            continue
        if int(status["NSpid"].split()[-1]) != pid:
            continue
        ancestor = int(status["PPid"])
        while ancestor > 1 and ancestor not in replicas:
            try:
                ancestor = int((Path("/proc") / str(ancestor) / "stat").read_text().rpartition(")")[2].split()[1])
            except OSError:
                break
        if ancestor in replicas:
            return int(entry.name)
    raise AssertionError(f"no process {pid} under the replicas {replicas}")


def test_the_processes_a_replica_started_stop_with_it(deployed, http):
    deployed(TEST_APPS / "wedge" / "wedge.py")
    replicas = {r["pid"] for s in http.get("/v1/apps/wedge").json()["services"] if s["name"] == "spawn_child"
                for r in s["replicas"]}
    child = _on_node(http.post("/v1/wedge/spawn_child").json(), replicas)
    assert not gone(child)
    try:
        assert http.delete("/v1/apps/wedge").status_code == 204
        wait_for(lambda: gone(child), timeout_s=60, what=f"process {child} to stop with its replica")
    finally:
        if not gone(child):
            os.kill(child, 9)


def _nap_replicas(http) -> list[dict]:
    services = http.get("/v1/apps/wedge").json()["services"]
    return next(s for s in services if s["name"] == "nap")["replicas"]


def _running(needle: str) -> bool:
    """Whether a process of this machine has ``needle`` in its command line."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle.encode() in (entry / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def test_a_replica_stuck_past_its_timeout_is_replaced_before_it_stops(platform, transport, http):
    deploy(TEST_APPS / "wedge" / "wedge.py", transport=transport, timeout_s=120)  # the test above deleted it
    stuck = [r["replica_id"] for r in _nap_replicas(http) if r["state"] == "ready"]
    assert len(stuck) == 1
    response = http.post("/v1/wedge/nap", json=60)
    assert response.status_code == 504, response.text
    replacement = wait_for(lambda: [r for r in _nap_replicas(http) if r["state"] == "ready"
                                    and r["replica_id"] not in stuck], timeout_s=60,
                           what="a replacement of the stuck replica")
    assert replacement
    counted = 'ember_replicas_replaced_total{app="wedge",reason="stuck",service="nap"} '
    assert any(line.startswith(counted) and float(line.split()[-1]) >= 1
               for line in http.get("/metrics").text.splitlines()), "the stuck replica's replacement, counted"
    # The stuck thread still sleeps; calls are served at once by the replacement.
    for _ in range(3):
        answer = http.post("/v1/wedge/nap", json=0.01)
        assert answer.status_code == 200, answer.text
    # and the stuck replica goes once its replacement serves
    wait_for(lambda: stuck[0] not in {r["replica_id"] for r in _nap_replicas(http)}, timeout_s=60,
             what="the stuck replica to go")
    # and its process leaves on its own, its stuck call still asleep: not killed once the node's drain grace ran out
    # (it waited for its stuck batch, then at exit for the model thread)
    wait_for(lambda: not _running(stuck[0]), timeout_s=60, what="the stuck replica's process to exit")
    assert f"replica {stuck[0]} still ran" not in (platform.state_dir / "logs" / "agent.log").read_text()
    http.delete("/v1/apps/wedge")
