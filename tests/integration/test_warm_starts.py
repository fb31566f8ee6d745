"""Warm starts against the real platform (``ember_runtime.warm``, ``agent/warm_starts.py``): once an app's replica
reported that it imported torch, the node agent keeps a fresh start begun ahead with torch imported; the app's next
version (pushed with ``ember push``) starts from it, as that version and with its own secrets, which never reach the
warm process's command line or first environment; so does the first start of another app of the same image and
sandbox, as that app; an app of another sandbox never takes it; a replica that began warm is adopted by a restarted
agent like any fresh one; a warm start goes when the last app that asked for it does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from support.auth import bearer
from support.platform import TestPlatform
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import app_view
from ember.wire import StatusView
from ember_runtime.agent.adoption import start_time

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

APP = '''import os

import torch

import ember

app = ember.App("{name}")


@app.function(min_replicas=1, max_replicas=1, secrets=["{secret}"]{options})
def who(text: str) -> dict:
    return {{"pid": int(os.environ.get("EMBER_HOST_PID") or os.getpid()), "key": os.environ.get("WARM_KEY", ""),
            "sum": float(torch.tensor([1.5, 2.5]).sum()), "text": text}}
'''


@pytest.fixture(scope="module")
def warm_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestPlatform]:
    with TestPlatform(tmp_path_factory.mktemp("warm") / "state", warm_starts=2) as platform:
        yield platform


@pytest.fixture(scope="module")
def client(warm_platform: TestPlatform) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=warm_platform.url, headers=bearer(warm_platform.token), timeout=60) as http:
        yield http


def _push(platform: TestPlatform, path: Path) -> None:
    pushed = subprocess.run([sys.executable, "-m", "ember.cli", "push", str(path)], capture_output=True, text=True,
                            timeout=240, check=False,
                            env={**os.environ, "EMBER_URL": platform.url, "EMBER_TOKEN": platform.token})
    assert pushed.returncode == 0, pushed.stderr


def _write(folder: Path, name: str, secret: str, version_note: str = "", options: str = "") -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"{name.replace('-', '_')}.py"
    path.write_text(APP.format(name=name, secret=secret, options=options) + version_note)
    return path


def _ready(platform: TestPlatform, app: str, version: int) -> list:
    transport = Transport(platform.url, token=platform.token)
    try:
        return [r for s in app_view(transport, app).services for r in s.replicas
                if r.state == "ready" and r.version == version]
    finally:
        transport.close()


def _warm_state(client: httpx.Client, app: str) -> str:
    view = msgspec.json.decode(client.get("/v1/status").content, type=StatusView)
    return next((n.warm_starts[app] for n in view.nodes if app in n.warm_starts), "")


def _warm_processes() -> dict[int, bytes]:
    """pid -> command line of each process of this machine that is (or began as) a warm start."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"ember_runtime.replica.warm\0" in argv and b"bwrap" not in argv.split(b"\0")[0]:
            found[int(pid)] = argv
    return found


def _secret(client: httpx.Client, name: str, app: str) -> str:
    value = f"warm-{uuid.uuid4().hex}"
    client.put(f"/v1/secrets/{name}", json={"values": {"WARM_KEY": value}, "apps": [app]}).raise_for_status()
    return value


def test_a_new_version_starts_from_its_apps_warm_start_as_itself(warm_platform, client, tmp_path):
    value = _secret(client, "ws-a", "warm-a")
    path = _write(tmp_path / "a", "warm-a", "ws-a")
    _push(warm_platform, path)
    [first] = wait_for(lambda: _ready(warm_platform, "warm-a", 1), 180, "warm-a v1 ready")
    assert first.start is not None and first.start.kind == "cold" and "torch" in first.start.modules
    wait_for(lambda: _warm_state(client, "warm-a") == "ready", 180, "warm-a's warm start")
    waiting = _warm_processes()
    assert waiting  # the warm start, torch imported, waiting for its replica; the secret is nowhere in it yet
    for pid in waiting:
        assert value.encode() not in Path(f"/proc/{pid}/environ").read_bytes() + waiting[pid]

    _push(warm_platform, _write(tmp_path / "a", "warm-a", "ws-a", "\n# version 2\n"))
    [second] = wait_for(lambda: _ready(warm_platform, "warm-a", 2), 180, "warm-a v2 ready")
    assert second.start is not None and second.start.kind == "warm" and second.start.interpreter_s < 5
    assert second.pid in waiting  # the process that waited is the new version's replica now
    answer = client.post("/v1/warm-a/who", json="hello")
    assert answer.status_code == 200, answer.text
    # served as version 2's replica, with the secret given at the take (not in its command line nor first environment)
    assert answer.json() == {"pid": second.pid, "key": value, "sum": 4.0, "text": "hello"}
    assert value.encode() not in Path(f"/proc/{second.pid}/environ").read_bytes()
    assert value.encode() not in Path(f"/proc/{second.pid}/cmdline").read_bytes()
    # the taken warm start is replaced, for the app's next start
    wait_for(lambda: _warm_state(client, "warm-a") in ("starting", "ready"), 60, "a new warm start of warm-a")


def test_another_app_of_the_same_sandbox_takes_it_at_its_first_start_as_itself(warm_platform, client, tmp_path):
    wait_for(lambda: _warm_state(client, "warm-a") == "ready", 180, "warm-a's warm start")
    waiting = _warm_processes()
    value = _secret(client, "ws-b", "warm-b")
    _push(warm_platform, _write(tmp_path / "b", "warm-b", "ws-b"))
    [b] = wait_for(lambda: _ready(warm_platform, "warm-b", 1), 180, "warm-b ready")
    # the first start of an app this node never ran: from the warm start warm-a's replica asked for
    assert b.start is not None and b.start.kind == "warm" and b.pid in waiting
    answer = client.post("/v1/warm-b/who", json="b")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"pid": b.pid, "key": value, "sum": 4.0, "text": "b"}  # warm-b's own secret, not a's
    assert value.encode() not in Path(f"/proc/{b.pid}/environ").read_bytes()
    # one warm start of the key for both apps, begun again after the take
    wait_for(lambda: _warm_state(client, "warm-b") == "ready" == _warm_state(client, "warm-a"), 180,
             "the key's next warm start, shown to both apps")
    # a replica begun warm that fails at once starts fresh next (its warm start may have held another app's imports)
    os.kill(b.pid, signal.SIGKILL)
    [again] = wait_for(lambda: [r for r in _ready(warm_platform, "warm-b", 1) if r.pid != b.pid], 180,
                       "warm-b's replica restarted")
    assert again.start is not None and again.start.kind == "artifact", again.start
    assert _warm_state(client, "warm-a") == "ready"  # the warm start, ready all along, was not taken


def test_an_app_of_another_sandbox_never_takes_it_and_a_warm_start_goes_with_its_last_app(
        warm_platform, client, tmp_path):
    wait_for(lambda: _warm_state(client, "warm-a") == "ready", 180, "warm-a's warm start")
    _secret(client, "ws-c", "warm-c")
    _push(warm_platform, _write(tmp_path / "c", "warm-c", "ws-c", options=", block_network=True"))
    [c] = wait_for(lambda: _ready(warm_platform, "warm-c", 1), 180, "warm-c ready")
    assert c.start is not None and c.start.kind == "cold"  # NATS only: another sandbox, another key
    assert _warm_state(client, "warm-a") == "ready"
    wait_for(lambda: _warm_state(client, "warm-c") == "ready", 180, "warm-c's own warm start")
    before = _warm_processes()
    client.delete("/v1/apps/warm-c").raise_for_status()
    wait_for(lambda: _warm_state(client, "warm-c") == "", 60, "warm-c's warm start to go with its app")
    wait_for(lambda: len(_warm_processes()) < len(before), 60, "its process to end")
    client.delete("/v1/apps/warm-b").raise_for_status()  # warm-a still asks for their key's warm start: it stays
    wait_for(lambda: _warm_state(client, "warm-b") == "", 60, "warm-b to be gone from the warm starts' apps")
    assert _warm_state(client, "warm-a") == "ready"
    status = subprocess.run([sys.executable, "-m", "ember.cli", "status"], capture_output=True, text=True, timeout=60,
                            check=True, env={**os.environ, "EMBER_URL": warm_platform.url,
                                             "EMBER_TOKEN": warm_platform.token}).stdout
    [row] = [line.split() for line in status.splitlines() if "warm-a" in line.split()[1:2]]
    assert row[1:] == ["warm-a", "ready"] and "WARM START OF" in status
    assert "warm-b" not in status and "warm-c" not in status


def test_a_replica_that_began_warm_is_adopted_by_a_restarted_agent(warm_platform, client):
    [replica] = wait_for(lambda: _ready(warm_platform, "warm-a", 2), 60, "warm-a v2 ready")
    assert replica.start is not None and replica.start.kind == "warm"
    warm_platform.kill("agent")
    assert start_time(replica.pid) is not None  # it outlived its agent, as a fresh replica does
    warm_platform.start_again("agent")
    log = warm_platform.log_dir / "agent.log"
    wait_for(lambda: f"replica {replica.replica_id} adopted" in log.read_text(), 60, "the replica adopted",
             explain=lambda: log.read_text()[-3000:])
    answer = client.post("/v1/warm-a/who", json="after")
    assert answer.status_code == 200 and answer.json()["pid"] == replica.pid
