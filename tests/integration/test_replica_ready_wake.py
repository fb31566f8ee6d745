"""The control plane's mirror of ``ember_replicas`` on a real nats-server: a replica whose status turns ready wakes the
control loop (``on_ready``, which the registry points at the loop's wake-up), once per turn, so that a rollout
waiting for that replica switches then, not at the next tick. A status the mirror refuses (another node's replica)
or one that stays ready (a heartbeat) wakes nothing."""

from __future__ import annotations

import asyncio
import time
import uuid

import msgspec
import pytest
from support.nats_cluster import NatsCluster
from support.natsconn import connect

from ember._loop import run as run_loop
from ember.wire import ReplicaStatus, subjects
from ember_platform.control.replica_mirror import ReplicaMirror

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory):
    with NatsCluster(tmp_path_factory.mktemp("nats"), size=1) as cluster:
        yield cluster.url


def _status(replica_id: str, node_id: str, state: str) -> bytes:
    return msgspec.json.encode(ReplicaStatus(replica_id=replica_id, node_id=node_id, app="a", service="S", version=2,
                                             state=state, pid=1, started_at=time.time(), updated_at=time.time()))


async def _states(url: str, writes: list[tuple[str, str, str]]) -> tuple[list[str], dict[str, str]]:
    """Write each (node, replica, state) in turn, waiting for the mirror to hold it; (the replicas whose status woke
    the loop, in order; the state the mirror holds for each replica)."""
    nc = await connect(url)
    replicas = await nc.jetstream().create_key_value(bucket=f"replicas_{uuid.uuid4().hex[:8]}")  # one per test
    woken: list[str] = []
    written: list[str] = []
    mirror = ReplicaMirror(replicas, on_ready=lambda: woken.append(written[-1]))
    mirror.know_assignments(lambda replica_id: "n1")  # every replica is assigned to node n1
    await mirror.start()
    try:
        for node_id, replica_id, state in writes:
            written.append(replica_id)
            seen = mirror.generation
            await replicas.put(subjects.replica_key(node_id, replica_id), _status(replica_id, node_id, state))
            while mirror.generation == seen and node_id == "n1":  # until held (a refused status never is)
                await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)  # what a refused write would have done, it has done by now
        return woken, {k: v.state for k, v in mirror.items.items()}
    finally:
        await mirror.stop()
        await nc.close()


def test_a_replica_turning_ready_wakes_the_loop_once_per_turn(nats_url: str) -> None:
    woken, held = run_loop(_states(nats_url, [
        ("n1", "r1", "starting"), ("n1", "r1", "ready"), ("n1", "r1", "ready"),  # a heartbeat: still ready
        ("n1", "r2", "ready"),  # first seen ready
        ("n1", "r1", "stopping"), ("n1", "r1", "ready"),  # ready again after it was not
    ]))
    assert woken == ["r1", "r2", "r1"]
    assert held == {"r1": "ready", "r2": "ready"}


def test_a_refused_status_wakes_nothing(nats_url: str) -> None:
    woken, held = run_loop(_states(nats_url, [("n2", "r3", "ready")]))  # n2 may not report n1's replica
    assert woken == [] and "r3" not in held
