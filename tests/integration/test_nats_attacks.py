"""A replica is a NATS client with only its own function's permissions, and only while it is assigned.

A hostile app, deployed next to a normal one, uses its replica's own connection to try what no replica may do;
every attempt is a permissions violation (in its log too), changes nothing, and the normal app keeps answering.
Clients without credentials, with forged ones, or with those of a stopped replica are refused.
"""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from support.natsconn import kv_value
from support.paths import REPO
from support.polling import wait_for

from ember._deploy import deploy
from ember.wire import natsflush, subjects
from ember.wire.natscreds import NatsCredentials, read_file, replica_credentials

pytestmark = [
    pytest.mark.integration,
    # nats-py leaves the socket of a refused connection for the garbage collector (an unclosed-transport warning)
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.usefixtures("collect_refused_sockets"),
]

ATTEMPTS = 13



def test_a_hostile_replica_gets_a_permissions_violation_for_each_attempt(platform, http, hello, deployed):
    deployed(REPO / "tests" / "apps" / "intruder" / "intruder.py")
    seen = http.post("/v1/intruder/attack", json="hello", timeout=180).json()
    assert len(seen) == ATTEMPTS
    for attempt, answer in seen.items():
        assert "permissions violation" in answer.lower() or "Timeout" in answer, (attempt, answer)
        assert "no error" not in answer, attempt

    # Nothing changed: no fake replica, no forged line in the normal app's logs, and it still answers.
    assert asyncio.run(kv_value(platform.nats_url, subjects.REPLICAS_BUCKET, "forged-replica")) is None
    lines = http.get("/v1/apps/hello/logs", params={"limit": 5000}).json()
    assert not any("FORGED" in line["line"] for line in lines)
    assert http.post("/v1/hello/greet", json="x").json() == "Hello, x!"

    # The violations show in the hostile replica's own log (NATS reports them asynchronously).
    logged = wait_for(lambda: [line for line in http.get("/v1/apps/intruder/logs", params={"limit": 5000}).json()
                               if "permissions violation" in line["line"]] or None,
                      timeout_s=30, what="the violations in the intruder's log")
    assert logged



async def _try_connect(url: str, creds: NatsCredentials | None) -> str:
    """``connected`` or the refusal."""
    try:
        nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5,
                                **(creds.connect_options() if creds else {}))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    await nc.close()
    return "connected"


def test_no_anonymous_or_forged_client_is_admitted(platform):
    node = read_file(platform.state_dir / "nats-creds" / f"{platform.node_id}.creds")
    forged = [
        None,  # anonymous
        NatsCredentials(user=node.user, password="0" * 64),  # a node with a guessed password
        NatsCredentials(user="node.elsewhere", password=node.password),  # another node's name, this one's password
        NatsCredentials(user="admin", password="admin"),
        NatsCredentials(user=f"replica.{platform.node_id}.not-assigned", password="x"),
        replica_credentials(node, "not-assigned-anywhere"),  # well derived, but no such replica is assigned
    ]
    for creds in forged:
        assert "Authorization" in asyncio.run(_try_connect(platform.nats_url, creds)), creds
    assert asyncio.run(_try_connect(platform.nats_url, node)) == "connected"  # the real node is admitted


def test_a_replicas_credentials_are_refused_once_it_is_no_longer_assigned(platform, http, transport, tmp_path):
    app_file = tmp_path / "shortlived.py"
    app_file.write_text("import ember\napp = ember.App('shortlived')\n\n\n@app.function()\n"
                        "def ping(x: int) -> int:\n    return x\n")
    view = deploy(app_file, transport=transport, timeout_s=120)
    replica_id = view.services[0].replicas[0].replica_id
    node = read_file(platform.state_dir / "nats-creds" / f"{platform.node_id}.creds")
    creds = replica_credentials(node, replica_id)
    assert asyncio.run(_try_connect(platform.nats_url, creds)) == "connected"
    assert http.delete("/v1/apps/shortlived").status_code == 204
    wait_for(lambda: "Authorization" in asyncio.run(_try_connect(platform.nats_url, creds)), timeout_s=60,
             what="the stopped replica's credentials to be refused")


def test_the_callers_credentials_are_not_handed_to_embers_processes(platform, monkeypatch):
    # `ember dev` tells its user to export EMBER_TOKEN; the processes it starts must not inherit it.
    monkeypatch.setenv("EMBER_TOKEN", "ember_callers_own_token")
    monkeypatch.setenv("EMBER_NATS_CREDS", '{"user":"someone"}')
    agent = platform.add_agent("env-check")
    try:
        environ = wait_for(lambda: _environ(agent.pid), timeout_s=30, what="the agent's environment")
        assert b"PYTHONUNBUFFERED=1" in environ  # read the right process
        assert b"ember_callers_own_token" not in environ and b"EMBER_NATS_CREDS=" not in environ
    finally:
        platform.kill("agent-env-check")


def _environ(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read() or None
    except OSError:
        return None


def test_a_node_speaks_only_for_its_own_replicas_in_the_logs(platform, http, hello):
    """A node agent may publish log lines only on its own node's subjects; a line it publishes naming another
    node's replica is dropped, and any other line is shown with the node that published it."""
    victim = hello.services[0].replicas[0].replica_id
    service = hello.services[0].name
    forger = read_file(platform.node_credentials("forger"))

    async def forge() -> str:
        nc = await nats.connect(platform.nats_url, **forger.connect_options())
        errors: list[str] = []

        def line(replica_id: str, text: str) -> bytes:
            return b'{"replica_id":"%s","stream":"stdout","line":"%s","ts":%f}' % (
                replica_id.encode(), text.encode(), time.time())

        try:
            await nc.publish(subjects.logs("hello", service, platform.node_id), line(victim, "FORGED AS THE NODE"))
            await natsflush.flush(nc)
            await asyncio.sleep(0.3)
            errors.append(repr(nc.last_error))
            await nc.publish(subjects.logs("hello", service, "forger"), line(victim, "FORGED FOR ITS REPLICA"))
            await nc.publish(subjects.logs("hello", service, "forger"), line("made-up", "SIGNED BY THE FORGER"))
            await natsflush.flush(nc)
        finally:
            await nc.close()
        return errors[0]

    assert "permissions violation" in asyncio.run(forge()).lower()
    signed = wait_for(lambda: [entry for entry in http.get("/v1/apps/hello/logs", params={"limit": 5000}).json()
                               if entry["line"] == "SIGNED BY THE FORGER"] or None, timeout_s=30,
                      what="the forger's own line")
    assert signed[0]["node_id"] == "forger"
    lines = [entry["line"] for entry in http.get("/v1/apps/hello/logs", params={"limit": 5000}).json()]
    assert "FORGED AS THE NODE" not in lines and "FORGED FOR ITS REPLICA" not in lines
