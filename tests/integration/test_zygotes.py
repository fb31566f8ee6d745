"""Zygotes against the real platform: a replica forked from its version's preloaded zygote answers as a
fresh one does; a killed zygote falls back to fresh starts and is rebuilt; scale-up forks; a new version
replaces the old zygote."""

from __future__ import annotations

import os
import signal

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.paths import TEST_APPS
from support.polling import wait_for

import ember
from ember._deploy import app_view
from ember.wire import StatusView, ZygoteStatus
from ember_runtime.agent import reap

pytestmark = pytest.mark.integration
SNAPPER = TEST_APPS / "snap" / "snapper.py"
HOLDER = TEST_APPS / "snap" / "holder.py"
X = [0.5, -1.0, 2.0, 0.25]




def zygote(transport, version: int) -> ZygoteStatus | None:
    view = msgspec.json.decode(transport.request("GET", "/v1/status", params={"app": "snapper"}).content,
                               type=StatusView)
    return next((z for node in view.nodes for z in node.zygotes if z.app == "snapper" and z.version == version), None)


def ready(transport, version: int) -> list:
    return [r for s in app_view(transport, "snapper").services for r in s.replicas
            if r.state == "ready" and r.version == version]


def test_replicas_fork_from_a_preloaded_zygote_and_fall_back_when_it_dies(tmp_path, transport, http, platform,
                                                                          ember_cli):
    app_file = tmp_path / "snapper.py"
    app_file.write_text(SNAPPER.read_text())
    version = ember.deploy(app_file, transport=transport, timeout_s=180).version
    built = wait_for(lambda: (z := zygote(transport, version)) and z.state == "ready" and z, what="the zygote")
    (first,) = wait_for(lambda: ready(transport, version), what="a ready replica")
    assert first.start is not None and first.start.kind == "zygote"
    # the fork imports nothing (the zygote did): its imports take less than the zygote's own build, whatever the load
    assert first.start.imports_s < built.build_s and first.start.snap_setup_s > 0 and first.start.fork_s >= 0
    response = http.post("/v1/snapper/Model.predict", json=X)
    assert response.status_code == 200, response.text
    forked = response.json()
    assert forked["built_by"] == built.pid != forked["pid"] == first.pid  # built in the zygote, served by the fork
    assert forked["env"] == "cpu"  # the replica's own environment, set after the fork
    metrics = text_string_to_metric_families(http.get("/metrics").text)
    phases = {(s.labels["replica"], s.labels["kind"], s.labels["phase"]) for family in metrics for s in family.samples
              if s.name == "ember_replica_start_seconds"}
    assert (first.replica_id, "zygote", "fork") in phases
    status = ember_cli("status", "snapper.Model", url=platform.url).stdout
    assert "ZYGOTE" in status and "ready" in status and f"{first.replica_id}  zygote" in status

    # Kill the zygote, then the replica: the replica starts fresh (the same answer), and the zygote is rebuilt.
    os.kill(built.pid, signal.SIGKILL)
    wait_for(lambda: (z := zygote(transport, version)) and z.failures >= 1 and z, what="the zygote's failure")
    events = transport.json("GET", "/v1/apps/snapper/logs", params={"service": "Model", "limit": 5000})
    assert any(e["stream"] == "agent" and f"zygote snapper.Model v{version} was killed by SIGKILL" in e["line"]
               for e in events)
    os.kill(first.pid, signal.SIGKILL)
    (fresh,) = wait_for(lambda: [r for r in ready(transport, version) if r.pid != first.pid], what="a fresh replica")
    answer = http.post("/v1/snapper/Model.predict", json=X).json()
    if fresh.start.kind != "zygote":  # the rebuilt zygote may have won the race; usually it has not
        assert answer["built_by"] == answer["pid"] == fresh.pid
    assert answer["y"] == forked["y"]
    rebuilt = wait_for(lambda: (z := zygote(transport, version)) and z.state == "ready" and z.pid != built.pid and z,
                       what="the rebuilt zygote")

    # Scale-up forks from the rebuilt zygote.
    http.post("/v1/apps/snapper/scale", json={"service": "Model", "min_replicas": 2, "max_replicas": 3})
    new = wait_for(lambda: [r for r in ready(transport, version) if r.pid not in (first.pid, fresh.pid)],
                   what="the scaled-up replica")
    assert new[0].start.kind == "zygote"
    assert wait_for(lambda: zygote(transport, version).forks >= 1, what="the fork count")
    assert rebuilt.pid == zygote(transport, version).pid

    # A new version gets its own zygote; the old one goes with the old replicas.
    app_file.write_text(SNAPPER.read_text() + "\n# version 2\n")
    second = ember.deploy(app_file, transport=transport, timeout_s=180).version
    wait_for(lambda: (z := zygote(transport, second)) and z.state == "ready", what="the new version's zygote")
    (newer, *_) = wait_for(lambda: ready(transport, second), what="a replica of the new version")
    assert newer.start.kind == "zygote"
    wait_for(lambda: zygote(transport, version) is None, what="the old version's zygote to go")
    transport.request("DELETE", "/v1/apps/snapper")


def test_a_forked_replica_outlives_the_closing_of_what_its_zygote_held(transport, http):
    """A forked replica lets go of the pipes and sockets its zygote inherited or opened, and each keeps its number
    until its owner closes it: closed under the Python objects that own them, the numbers went to the replica's own
    descriptors (its NATS connection, its event loop's), which each owner's close then closed."""
    version = ember.deploy(HOLDER, transport=transport, timeout_s=180).version
    (replica,) = wait_for(lambda: [r for s in app_view(transport, "holder").services for r in s.replicas
                                   if r.state == "ready" and r.version == version], what="a ready replica")
    assert replica.start is not None and replica.start.kind == "zygote"
    dropped = http.post("/v1/holder/Holder.drop", json={})
    assert dropped.status_code == 200, dropped.text
    assert dropped.json()["built_by"] != dropped.json()["pid"] == replica.pid  # the zygote's objects, in the fork
    for i in range(20):
        answer = http.post("/v1/holder/Holder.ping", json=i)
        assert answer.status_code == 200 and answer.json() == i, answer.text
    (after,) = [r for s in app_view(transport, "holder").services for r in s.replicas if r.version == version]
    assert after.pid == replica.pid and after.restarts == 0
    transport.request("DELETE", "/v1/apps/holder")


def _children(pid: int) -> set[int]:
    return {int(c) for c in reap.children(pid)}


def test_a_zygote_keeps_a_spare_for_each_start_expected_on_its_node(tmp_path, transport, http):
    """The scheduler sizes each zygote's spares (children forked ahead of their requests) by the starts it expects
    on the node: up to the function's max_replicas; one, for a restart, once it runs that many."""
    app_file = tmp_path / "snapper.py"
    app_file.write_text(SNAPPER.read_text())  # min_replicas=1, max_replicas=3, on the platform's one node
    version = ember.deploy(app_file, transport=transport, timeout_s=180).version
    built = wait_for(lambda: (z := zygote(transport, version)) and z.state == "ready" and z.spares == 2 and z,
                     what="the zygote keeping two spares")
    (first,) = wait_for(lambda: ready(transport, version), what="a ready replica")
    spare = wait_for(lambda: len(waiting := _children(built.pid) - {first.pid}) == 2 and waiting, what="two spares")

    http.post("/v1/apps/snapper/scale", json={"service": "Model", "min_replicas": 3, "max_replicas": 3})
    replicas = wait_for(lambda: len(r := ready(transport, version)) == 3 and r, what="three replicas")
    assert {r.start.kind for r in replicas} == {"zygote"}
    assert {r.pid for r in replicas} - {first.pid} == spare  # each was a spare, handed over
    wait_for(lambda: zygote(transport, version).spares == 1, what="one spare, for a restart")
    wait_for(lambda: len(_children(built.pid) - {r.pid for r in replicas}) == 1, what="the one spare left")
    assert zygote(transport, version).pid == built.pid
    transport.request("DELETE", "/v1/apps/snapper")
