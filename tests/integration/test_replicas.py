"""Replica lifecycle: crash recovery, new versions, deletion, logs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import time

import httpx
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.auth import authed_client, bearer
from support.natsconn import connect as admin_connect
from support.polling import wait_for

import ember
from ember._deploy import app_view

pytestmark = pytest.mark.integration
HOST_PID = 'int(os.environ.get("EMBER_HOST_PID") or os.getpid())'  # a replica's pid on the node, sandboxed or not


def ready_pids(transport, app: str, service: str) -> set[int]:
    view = app_view(transport, app)
    svc = next(s for s in view.services if s.name == service)
    return {r.pid for r in svc.replicas if r.state == "ready" and r.version == view.version}




def test_sigkilled_replica_is_restarted_and_serves_again(probe, transport, http):
    (old_pid,) = ready_pids(transport, "probe", "pid")
    assert http.post("/v1/probe/pid").json() == old_pid
    os.kill(old_pid, signal.SIGKILL)
    # A call made while the replica is down waits for its replacement instead of failing.
    response = http.post("/v1/probe/pid", headers={"X-Ember-Timeout": "30"})
    assert response.status_code == 200, response.text
    new_pid = response.json()
    assert new_pid != old_pid
    wait_for(lambda: ready_pids(transport, "probe", "pid") == {new_pid}, what="the new replica to be ready")
    view = app_view(transport, "probe")
    replica = next(r for s in view.services if s.name == "pid" for r in s.replicas)
    assert replica.restarts >= 1


def test_a_new_version_replaces_the_old_one(tmp_path, transport, http):
    app_file = tmp_path / "versioned.py"
    source = 'import ember\napp = ember.App("versioned")\n@app.function()\ndef which() -> str:\n    return "{}"\n'
    app_file.write_text(source.format("one"))
    first = ember.deploy(app_file, transport=transport, timeout_s=60)
    assert http.post("/v1/versioned/which").json() == "one"
    again = ember.deploy(app_file, transport=transport, timeout_s=60)
    assert again.version == first.version  # same bundle, same manifest: nothing to roll out
    app_file.write_text(source.format("two"))
    second = ember.deploy(app_file, transport=transport, timeout_s=60)
    assert second.version == first.version + 1
    assert http.post("/v1/versioned/which").json() == "two"
    wait_for(lambda: all(r.version == second.version for s in app_view(transport, "versioned").services
                         for r in s.replicas), what="the old version's replicas to stop")
    transport.request("DELETE", "/v1/apps/versioned")


def test_deleting_an_app_stops_its_replicas(tmp_path, transport, http):
    app_file = tmp_path / "doomed.py"
    app_file.write_text('import ember, os\napp = ember.App("doomed")\n'
                        f"@app.function()\ndef pid() -> int:\n    return {HOST_PID}\n")
    ember.deploy(app_file, transport=transport, timeout_s=60)
    pid = http.post("/v1/doomed/pid").json()
    transport.request("DELETE", "/v1/apps/doomed")
    assert http.post("/v1/doomed/pid").status_code == 404
    wait_for(lambda: not _alive(pid), what=f"replica {pid} to exit")


def test_replica_output_reaches_the_logs(hello, http, transport):
    http.post("/v1/hello/greet", json="Logan")
    lines = wait_for(lambda: [line for line in transport.json("GET", "/v1/apps/hello/logs?service=greet")
                              if "greeting Logan" in line["line"]], what="the log line")
    assert lines[0]["replica_id"].startswith("hello-greet-")


def test_a_setup_that_keeps_failing_fails_the_push_with_its_reason(tmp_path, transport, http):
    """A few failed setups in a row and the version is failed: push says why at once, instead of waiting for
    its timeout, and status shows it; the agent stops restarting it."""
    app_file = tmp_path / "broken.py"
    app_file.write_text('import ember\napp = ember.App("broken")\n@app.model()\nclass M:\n'
                        "    @ember.setup\n    def load(self):\n        raise RuntimeError('no weights here')\n"
                        "    @ember.method()\n    def f(self) -> int:\n        return 1\n")
    with pytest.raises(ember.RemoteError, match=r"setup failed 3 times in a row.*no weights here"):  # not its timeout
        ember.deploy(app_file, transport=transport, timeout_s=120)
    status = http.get("/v1/status", params={"app": "broken"}).json()["services"][0]
    assert "no weights here" in status["failure"] and status["ready"] == 0
    restarts = transport.json("GET", "/v1/apps/broken")["services"][0]["replicas"][0]["restarts"]
    time.sleep(3)  # past the backoff it would have restarted after
    assert transport.json("GET", "/v1/apps/broken")["services"][0]["replicas"][0]["restarts"] == restarts
    transport.request("DELETE", "/v1/apps/broken")


def test_a_setup_past_its_startup_timeout_counts_as_failed(tmp_path, transport):
    app_file = tmp_path / "slow.py"
    app_file.write_text('import time\nimport ember\napp = ember.App("slowsetup")\n'
                        "@app.model(startup_timeout_s=1)\nclass M:\n"
                        "    @ember.setup\n    def load(self):\n        time.sleep(600)\n"
                        "    @ember.method()\n    def f(self) -> int:\n        return 1\n")
    with pytest.raises(ember.RemoteError, match=r"setup failed 3 times.*did not finish within startup_timeout_s"):
        ember.deploy(app_file, transport=transport, timeout_s=120)
    transport.request("DELETE", "/v1/apps/slowsetup")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_call_held_by_a_replica_that_dies_is_sent_again(probe, transport, platform):
    (victim,) = ready_pids(transport, "probe", "slow")
    with concurrent.futures.ThreadPoolExecutor(1) as pool, authed_client(platform) as client:
        future = pool.submit(client.post, "/v1/probe/slow", json=1.75, headers={"X-Ember-Timeout": "45"})
        wait_for(lambda: any("slow(1.75) started" in line["line"]
                             for line in transport.json("GET", "/v1/apps/probe/logs?service=slow")),
                 timeout_s=20, what="the replica to start the call")
        os.kill(victim, signal.SIGKILL)
        response = future.result()
    assert response.status_code == 200, response.text
    assert response.json() == 1.75
    assert victim not in ready_pids(transport, "probe", "slow")


def test_a_new_version_is_visible_as_soon_as_deploy_returns(tmp_path, transport):
    app_file = tmp_path / "fresh.py"
    for n in range(5):
        app_file.write_text(f'import ember\napp = ember.App("fresh")\n@app.function(min_replicas=0)\n'
                            f"def f() -> int:\n    return {n}\n")
        view = ember.deploy(app_file, transport=transport, wait=False)
        assert app_view(transport, "fresh").version == view.version
    transport.request("DELETE", "/v1/apps/fresh")
    with pytest.raises(ember.NotFoundError):
        app_view(transport, "fresh")


def test_a_call_whose_client_went_away_is_dropped_from_the_queue(probe, transport, platform):
    with authed_client(platform) as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
        busy = pool.submit(client.post, "/v1/probe/slow", json=2.5)  # occupies the serial replica
        wait_for(lambda: any("slow(2.5) started" in line["line"]
                             for line in transport.json("GET", "/v1/apps/probe/logs?service=slow")),
                 timeout_s=20, what="the first call to start")
        with authed_client(platform, timeout=0.5) as impatient, pytest.raises(httpx.ReadTimeout):
            impatient.post("/v1/probe/slow", json=0.25)  # queued behind it; the client gives up
        assert busy.result().status_code == 200

    def cancelled() -> int:
        view = app_view(transport, "probe")
        return sum(f.cancelled for s in view.services if s.name == "slow" for r in s.replicas for f in r.functions)

    wait_for(lambda: cancelled() >= 1, timeout_s=20, what="the replica to report the cancelled call")
    # A later call runs after anything still queued: once it has run, the dropped one would have too.
    later = httpx.post(f"{platform.url}/v1/probe/slow", json=0.01, timeout=30, headers=bearer(platform.token))
    assert later.status_code == 200

    def log_with_the_later_call() -> list[str] | None:
        lines = [line["line"] for line in transport.json("GET", "/v1/apps/probe/logs?service=slow")]
        return lines if any("slow(0.01) started" in line for line in lines) else None

    assert not any("slow(0.25) started" in line for line in wait_for(log_with_the_later_call))


def test_a_replica_start_is_measured_phase_by_phase(tmp_path, transport, http):
    app_file = tmp_path / "phased.py"
    app_file.write_text('import os\nimport ember\napp = ember.App("phased")\n'
                        f"@app.function()\ndef pid() -> int:\n    return {HOST_PID}\n")
    ember.deploy(app_file, transport=transport, timeout_s=60)

    def replica():
        ready = [r for s in app_view(transport, "phased").services for r in s.replicas if r.state == "ready"]
        return ready[0] if len(ready) == 1 else None

    first = replica()
    assert first is not None
    assert first.start is not None and first.start.kind == "cold" and first.start.fetch_s > 0
    phases = first.start
    assert min(phases.interpreter_s, phases.imports_s, phases.setup_s) >= 0
    assert phases.ready_s >= phases.fetch_s + phases.interpreter_s + phases.imports_s + phases.setup_s - 0.01
    assert http.post("/v1/phased/pid").json() == first.pid
    wait_for(lambda: (r := replica()) and r.start.first_call_s is not None, what="the first call to be recorded")
    os.kill(first.pid, signal.SIGKILL)
    again = wait_for(lambda: (r := replica()) and r.pid != first.pid and r, what="the restarted replica")
    assert again.start.kind == "artifact" and again.start.fetch_s == 0  # the bundle was on disk
    metrics = text_string_to_metric_families(http.get("/metrics").text)
    phases = {(s.labels["app"], s.labels["service"], s.labels["replica"], s.labels["kind"], s.labels["phase"])
              for family in metrics for s in family.samples if s.name == "ember_replica_start_seconds"}
    assert ("phased", "pid", again.replica_id, "artifact", "imports") in phases
    transport.request("DELETE", "/v1/apps/phased")


def test_only_calls_held_for_a_while_are_acked(probe, transport, platform):
    """The replica acks a synchronous call (naming itself) only when it has not answered it within a few
    milliseconds: the gateway needs the holder to resend or cancel a long call, not for a fast one."""
    from ember.wire import Invocation, answers_decoder, encoder, subjects

    (holder,) = [r.replica_id for s in app_view(transport, "probe").services if s.name == "slow"
                 for r in s.replicas if r.state == "ready"]
    version = app_view(transport, "probe").version

    async def exchange(seconds: float) -> list:
        nc = await admin_connect(platform.nats_url)
        inbox = f"{subjects.answers_inbox(f'test-{time.monotonic_ns()}')}.probe"  # where a gateway takes answers
        got: asyncio.Queue = asyncio.Queue()
        await nc.subscribe(f"{inbox}.*", cb=got.put)
        call = Invocation(call_id=f"ack-{seconds}", function="slow", deadline=time.time() + 30,
                          input=msgspec.Raw(json.dumps(seconds).encode()))
        await nc.publish(subjects.invoke("probe", "slow", version), encoder.encode([call]), reply=f"{inbox}.x")
        answers = answers_decoder.decode((await asyncio.wait_for(got.get(), 30)).data)
        while answers[-1].ack:
            answers += answers_decoder.decode((await asyncio.wait_for(got.get(), 30)).data)
        await nc.close()
        return answers

    # A fast call is answered without an ack, unless the replica waited for a core past the ack's few milliseconds
    # (a busy machine: CI once); one of a few tries is enough to show that fast calls are not acked.
    tries = [asyncio.run(exchange(0.0)) for _ in range(5)]
    fast = next((answers for answers in tries if len(answers) == 1), None)
    assert fast is not None, tries
    assert (fast[0].call_id, bytes(fast[0].output)) == ("ack-0.0", b"0.0")
    ack, answer = asyncio.run(exchange(0.5))
    assert (ack.call_id, ack.ack) == ("ack-0.5", holder)
    assert (answer.call_id, answer.ack, bytes(answer.output)) == ("ack-0.5", "", b"0.5")


def test_a_replica_that_exits_with_a_code_read_as_a_realtime_signal_is_restarted(tmp_path, transport, http):
    """A sandbox's exit status 128 + N is read as signal N: 165 is signal 37, a real-time signal that ``signal``'s
    enum does not name. Asked its name, the agent's supervision of that replica died, and it was never started
    again (min_replicas quietly broken)."""
    app_file = tmp_path / "exits.py"
    app_file.write_text("import os\nimport ember\napp = ember.App('exits')\n\n@app.function(min_replicas=1)\n"
                        f"def leave(code: int) -> int:\n    os._exit(code)\n\n@app.function(min_replicas=1)\n"
                        f"def pid() -> int:\n    return {HOST_PID}\n")
    ember.deploy(app_file, transport=transport, timeout_s=120)
    try:
        (old,) = ready_pids(transport, "exits", "leave")
        http.post("/v1/exits/leave", json=165, headers={"X-Ember-Timeout": "5"})  # its replica leaves: no answer
        wait_for(lambda: (pids := ready_pids(transport, "exits", "leave")) and old not in pids, timeout_s=60,
                 what="the replica started again")
        replica = next(r for s in app_view(transport, "exits").services if s.name == "leave" for r in s.replicas)
        assert replica.restarts >= 1 and "killed by signal 37" in replica.restart_reason, replica
    finally:
        http.delete("/v1/apps/exits")
