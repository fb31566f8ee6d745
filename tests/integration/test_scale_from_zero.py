"""Work wakes a function scaled to zero: an event backlog counts as pending calls, like spawned ones, and a synchronous
call waiting at the gateway counts too; also once the control loop has had nothing to do for the function."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest
from support.natsconn import connect as admin_connect
from support.polling import wait_for

from ember._deploy import deploy
from ember.wire import StatusView, ZygoteStatus, subjects
from ember_platform.control.pace import TICK_S
from ember_runtime.replica.event_headers import event_scope

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

APP = '''import ember
app = ember.App("sleepy")

@app.function(on="events.sleepy.in.>", min_replicas=0, max_replicas=1)
def wake(x: int) -> int:
    return x + 1
'''


def test_an_event_wakes_a_function_scaled_to_zero(platform, transport, http, tmp_path: Path):
    (tmp_path / "sleepy.py").write_text(APP)
    deploy(tmp_path / "sleepy.py", transport=transport, timeout_s=60)
    try:
        assert http.get("/v1/apps/sleepy").json()["services"][0]["replicas"] == []  # nothing runs yet

        async def publish() -> None:
            nc = await admin_connect(platform.nats_url)
            try:
                await nc.jetstream().publish("events.sleepy.in.one", b"41", headers={"Nats-Msg-Id": "wake-1"})
            finally:
                await nc.close()

        asyncio.run(publish())
        call_id = f"ev-{event_scope(subjects.events_stream('sleepy', 'wake'))}-wake-1"

        def done() -> dict | None:
            response = http.get(f"/v1/calls/{call_id}")
            record = response.json() if response.status_code == 200 else {}
            return record if record.get("status") == "succeeded" else None

        record = wait_for(done, timeout_s=90, what="the event to wake a replica and run")
        assert record["output"] == 42
    finally:
        http.delete("/v1/apps/sleepy")


IDLE_APP = '''import ember
app = ember.App("{name}")

@app.function(min_replicas=0, max_replicas=1, timeout_s=120)
def wake(x: int) -> int:
    return x + 1
'''


def _deploy_idle(name: str, transport, http, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / f"{name}.py").write_text(IDLE_APP.format(name=name))
    deploy(tmp_path / f"{name}.py", transport=transport, timeout_s=60)
    assert http.get(f"/v1/apps/{name}").json()["services"][0]["replicas"] == []
    time.sleep(2 * TICK_S)  # the control loop reconciles it to no replica, then has nothing to do for it


def test_a_synchronous_call_wakes_a_function_idle_at_zero(transport, http, tmp_path: Path):
    _deploy_idle("drowsy", transport, http, tmp_path)
    try:
        response = http.post("/v1/drowsy/wake", json=41, timeout=150)
        assert response.status_code == 200, response.text
        assert response.json() == 42
    finally:
        http.delete("/v1/apps/drowsy")


def test_a_synchronous_call_at_a_standby_control_plane_wakes_a_function_idle_at_zero(platform, transport, http,
                                                                                       tmp_path: Path):
    """Only the lease holder scales: a call that reached another control plane (two behind a load balancer) was
    never seen by it, and waited until its deadline. Now every control plane hears of it."""
    _deploy_idle("dreamy", transport, http, tmp_path)
    standby = platform.add_control_plane("zero-standby")
    try:
        response = http.post(f"{standby}/v1/dreamy/wake", json=41, timeout=150)
        assert response.status_code == 200, response.text
        assert response.json() == 42
    finally:
        platform.kill("zero-standby")
        http.delete("/v1/apps/dreamy")


def test_a_spawned_call_wakes_a_function_idle_at_zero(transport, http, tmp_path: Path):
    _deploy_idle("dozy", transport, http, tmp_path)
    try:
        call_id = http.post("/v1/dozy/wake/spawn", json=41).json()["call_id"]

        def done() -> dict | None:
            record = http.get(f"/v1/calls/{call_id}").json()
            return record if record.get("status") == "succeeded" else None

        assert wait_for(done, timeout_s=90, what="the spawned call to wake a replica and run")["output"] == 42
    finally:
        http.delete("/v1/apps/dozy")


SNAP_APP = '''import os

import ember
app = ember.App("napper")

@app.model(min_replicas=0, max_replicas=1)
class Napper:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.built_by = int(os.environ.get("EMBER_HOST_PID") or os.getpid())

    @ember.method
    def wake(self, x: int) -> dict:
        return {"y": x + 1, "built_by": self.built_by}
'''


def _zygote(transport) -> ZygoteStatus | None:  # type: ignore[no-untyped-def]
    view = msgspec.json.decode(transport.request("GET", "/v1/status", params={"app": "napper"}).content,
                               type=StatusView)
    return next((z for node in view.nodes for z in node.zygotes if z.app == "napper" and z.state == "ready"), None)


def test_the_first_call_to_a_function_at_zero_forks_from_its_preloaded_zygote(transport, http, tmp_path: Path):
    """A function that asked for no replicas keeps a zygote where its first replica would start (while the node has
    room): the call that wakes it is a fork, not a cold start."""
    (tmp_path / "napper.py").write_text(SNAP_APP)
    deploy(tmp_path / "napper.py", transport=transport, timeout_s=60)
    try:
        assert http.get("/v1/apps/napper").json()["services"][0]["replicas"] == []
        built = wait_for(lambda: _zygote(transport), timeout_s=90, what="the idle function's zygote")
        response = http.post("/v1/napper/Napper.wake", json=41, timeout=150)
        assert response.status_code == 200, response.text
        assert response.json() == {"y": 42, "built_by": built.pid}  # set up in the zygote, before the fork
        [replica] = [r for s in http.get("/v1/apps/napper").json()["services"] for r in s["replicas"]]
        assert replica["start"]["kind"] == "zygote"
    finally:
        http.delete("/v1/apps/napper")
