"""A node agent SIGKILLed and started again: its replicas keep serving, and the new agent adopts them (same replica,
same process, its output still in the logs); an agent that stays away longer than its lease has its replicas
started elsewhere, and the ones it left stop by themselves; a clean stop leaves nothing running."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.auth import bearer
from support.platform import TestPlatform
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import app_view, deploy
from ember_runtime.agent.adoption import start_time

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
PACE_S = 0.005  # a call every few milliseconds across the agent's restart, not as many as two shared cores allow

APP = '''import os

import ember

app = ember.App("adopt")


@app.function(min_replicas=1, max_replicas=1)
def whoami(text: str) -> int:
    print(f"said {text}", flush=True)
    return int(os.environ.get("EMBER_HOST_PID") or os.getpid())  # in a sandbox: its pid on the node
'''


class Caller:
    """Calls ``whoami`` in a loop, one at a time, at most one every ``PACE_S``, and keeps each answer (status,
    body)."""

    def __init__(self, platform: TestPlatform) -> None:
        self.answers: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._http = httpx.Client(base_url=platform.url, headers=bearer(platform.token), timeout=30)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Caller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self._http.close()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                response = self._http.post("/v1/adopt/whoami", json=f"call-{n}")
                self.answers.append((response.status_code, response.text))
            except httpx.HTTPError as exc:
                self.answers.append((0, repr(exc)))
            n += 1
            self._stop.wait(max(0.0, started + PACE_S - time.monotonic()))


def _replicas(transport: Transport) -> list[tuple[str, str, int, int]]:
    """(replica id, node id, pid, restarts) of the ready replicas of ``whoami``."""
    view = app_view(transport, "adopt")
    return sorted((r.replica_id, r.node_id, r.pid, r.restarts) for s in view.services for r in s.replicas
                  if r.state == "ready")


def _running(pid: int) -> bool:
    return start_time(pid) is not None


def _deploy(platform: TestPlatform, tmp_path: Path) -> Transport:
    (tmp_path / "adopt.py").write_text(APP)
    transport = Transport(platform.url, token=platform.token)
    deploy(tmp_path / "adopt.py", transport=transport, timeout_s=120)
    return transport


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandboxed", "unsandboxed"])
def test_a_restarted_agent_adopts_its_replicas_and_no_call_fails(tmp_path: Path, sandbox: bool):
    with TestPlatform(tmp_path / "state", sandbox=sandbox) as platform:
        if not sandbox:  # the other way to start a replica (no bwrap, no network of its own)
            assert any("UNSANDBOXED" in note for note in platform.isolation_notes())
        transport = _deploy(platform, tmp_path)
        try:
            before = wait_for(lambda: len(_replicas(transport)) == 1 and _replicas(transport), 60, "a ready replica")
            [(replica_id, _, pid, restarts)] = before
            records = tmp_path / "state" / "node" / "replicas"
            assert (records / replica_id / "record.json").is_file()
            assert records.stat().st_mode & 0o777 == 0o700
            with Caller(platform) as caller:
                wait_for(lambda: len(caller.answers) >= 20, 30, "calls before the kill")
                platform.kill("agent")
                killed_at = len(caller.answers)
                time.sleep(3)  # the agent is away, as a supervisor restarting it would leave it
                assert _running(pid)  # the replica outlived its agent...
                assert len(caller.answers) > killed_at  # ...and served meanwhile
                platform.start_again("agent")
                log = platform.log_dir / "agent.log"
                wait_for(lambda: f"replica {replica_id} adopted" in log.read_text(), 60, "the replica adopted")
                served = len(caller.answers)
                wait_for(lambda: len(caller.answers) >= served + 20, 30, "calls after the adoption")
            failed = [a for a in caller.answers if a[0] != 200]
            assert not failed, f"{len(failed)} of {len(caller.answers)} calls failed: {failed[:5]}"
            assert {int(body) for _, body in caller.answers} == {pid}  # the same process answered every call
            # The same replica, not a new one, reported by the new agent; its output still reaches the logs.
            assert wait_for(lambda: _replicas(transport) == before and _replicas(transport), 30,
                            "the adopted replica reported") == [(replica_id, platform.node_id, pid, restarts)]
            httpx.post(f"{platform.url}/v1/adopt/whoami", json="after-adoption", headers=bearer(platform.token),
                       timeout=30).raise_for_status()
            wait_for(lambda: [line for line in transport.json("GET", "/v1/apps/adopt/logs?service=whoami")
                              if "said after-adoption" in line["line"]], 30, "its output in the logs")
        finally:
            transport.close()
    # A clean stop (the platform's SIGTERM to its agent) drains and stops the replica: nothing is left running.
    assert not _running(pid)
    assert not any(records.iterdir())


def test_a_replica_that_ended_while_its_agent_was_away_starts_again_as_the_same_replica(tmp_path: Path):
    with TestPlatform(tmp_path / "state") as platform:
        transport = _deploy(platform, tmp_path)
        try:
            [(replica_id, node, pid, restarts)] = wait_for(lambda: len(_replicas(transport)) == 1 and
                                                           _replicas(transport), 60, "a ready replica")
            platform.kill("agent")
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not _running(pid), 30, "the replica to end")
            platform.start_again("agent")
            again = wait_for(lambda: [r for r in _replicas(transport) if r[2] != pid], 60, "the replica started again")
            assert again == [(replica_id, node, again[0][2], restarts + 1)]  # the same replica, restarted once
            view = app_view(transport, "adopt")
            [reason] = [r.restart_reason for s in view.services for r in s.replicas if r.state == "ready"]
            assert "ended while its node agent was away" in reason
        finally:
            transport.close()


def test_an_agent_away_longer_than_its_lease_has_its_replicas_started_elsewhere(tmp_path: Path):
    with TestPlatform(tmp_path / "state") as platform:
        platform.add_agent("node-b")
        transport = _deploy(platform, tmp_path)
        try:
            wait_for(lambda: "node-b" in {n["node_id"] for n in transport.json("GET", "/v1/status")["nodes"]}, 60,
                     "node-b to report")
            [(replica_id, node, pid, _)] = wait_for(lambda: len(_replicas(transport)) == 1 and _replicas(transport),
                                                    60, "a ready replica")
            platform.kill("agent" if node == platform.node_id else f"agent-{node}")
            moved = wait_for(lambda: [r for r in _replicas(transport) if r[1] != node], 90,
                             "a replacement on the other node")
            assert moved[0][0] != replica_id
            # The replica the lost agent left stops by itself (it drains) once no agent adopted it within the lease.
            wait_for(lambda: not _running(pid), 60, "the lost agent's replica to stop by itself")
            answered = httpx.post(f"{platform.url}/v1/adopt/whoami", json="x", headers=bearer(platform.token),
                                  timeout=30)
            assert answered.status_code == 200 and int(answered.text) == moved[0][2]
        finally:
            transport.close()

