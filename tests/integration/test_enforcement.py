"""The node agent holds replicas to what they were given, on a node with a declared (virtual) inventory:
a replica over its GPU memory reservation is restarted with an event, its threads run on the CPUs of its GPU's
NUMA node (a real process, pinned by the real agent; only the GPUs are declared), and its sandbox holds its own
GPUs' device nodes (the agent's stand-ins for virtual GPUs), no other GPU's."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from support.auth import authed_client
from support.paths import TEST_APPS
from support.platform import TestPlatform
from support.polling import wait_for
from support.procs import gone

import ember
from ember._client import Transport
from ember._deploy import app_view
from ember.dev.embedded import EmbeddedPlatform
from ember.wire import ReplicaStatus
from ember_runtime.agent.gpu_usage import process_trees

pytestmark = pytest.mark.integration
APP = TEST_APPS / "enforce" / "enforce.py"
NODE = "enforcer"
OPEN_NODE = "enforcer-open"  # without sandboxes: its GPU replicas fork from their zygotes
SHARED_NODES = ["nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]  # stand-ins: no nvidia-caps


def inventory(cpu: int, name: str = "enf", gpus: tuple[str, ...] = ("H100-80GB", "L4-24GB")) -> str:
    """Two NUMA nodes: node 0 is ``cpu`` alone, node 1 has CPUs no machine here has; GPU i on NUMA node i."""
    declared = "".join(f'[[gpu]]\nmodel = "{model}"\nnuma_node = {i}\n' for i, model in enumerate(gpus))
    return f"""
[host]
name = "{name}"
[[numa]]
node = 0
cpus = "{cpu}"
[[numa]]
node = 1
cpus = "60000-60001"
{declared}"""


class Cluster(NamedTuple):
    platform: EmbeddedPlatform
    transport: Transport
    http: httpx.Client
    agent: subprocess.Popen[bytes]
    cpu: int




@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("enforce")
    cpu = min(os.sched_getaffinity(0))
    (tmp / "node.toml").write_text(inventory(cpu))
    (tmp / "open.toml").write_text(inventory(cpu, "open", ("A10G-24GB",)))
    with TestPlatform(tmp / "state") as platform, authed_client(platform) as http:
        # Sandboxed, as production runs replicas: the virtual driver finds each entry's process by who holds it
        # open, as NVML knows a context's process, whatever pid namespace the process sees.
        agent = platform.add_agent(NODE, tmp / "node.toml")
        platform.add_agent(OPEN_NODE, tmp / "open.toml", sandbox=False)
        transport = Transport(platform.url, token=platform.token)
        try:
            wait_for(lambda: {NODE, OPEN_NODE} <= {n["node_id"] for n in transport.json("GET", "/v1/status")["nodes"]},
                     60, "the nodes with the declared inventories to report")
            ember.deploy(APP, transport=transport, timeout_s=120)
            yield Cluster(platform, transport, http, agent, cpu)
        finally:
            transport.close()


def replica(cluster: Cluster, service: str) -> ReplicaStatus:
    (status,) = [r for s in app_view(cluster.transport, "enforce").services if s.name == service for r in s.replicas]
    return status


def proc_status(pid: int, field: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return value.strip()
    raise AssertionError(f"/proc/{pid}/status has no {field}")


def proc_env(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(entry.partition("=")[::2] for entry in entries if entry)


def test_a_replica_runs_on_the_cpus_of_its_gpus_numa_node(cluster: Cluster) -> None:
    hog, far = replica(cluster, "hog"), replica(cluster, "far")
    assert (hog.node_id, hog.state, far.node_id, far.state) == (NODE, "ready", NODE, "ready")
    assert proc_status(hog.pid, "Cpus_allowed_list") == str(cluster.cpu)
    if "OMP_NUM_THREADS" not in os.environ:  # the operator's setting wins
        assert proc_env(hog.pid)["OMP_NUM_THREADS"] == "1"
    # far's GPU is on a NUMA node whose CPUs this machine lacks: it runs unpinned, as the agent does.
    assert proc_status(far.pid, "Cpus_allowed_list") == proc_status(cluster.agent.pid, "Cpus_allowed_list")
    assert "OMP_NUM_THREADS" not in proc_env(far.pid) or "OMP_NUM_THREADS" in os.environ
    agent_log = (cluster.platform.log_dir / f"agent-{NODE}.log").read_text()
    assert "the CPUs of NUMA node 1 (60000-60001) do not exist here or are not allowed" in agent_log
    assert "host memory: 1024 MB of" in agent_log  # far declared memory="1GB"; the agent counts it


def test_a_replica_forked_from_its_zygote_runs_its_model_on_the_cpus_of_its_gpus_numa_node(cluster: Cluster) -> None:
    wait_for(lambda: replica(cluster, "Pinned").state == "ready", 60, "Pinned's replica to be ready")
    pinned = replica(cluster, "Pinned")
    assert pinned.node_id == OPEN_NODE and pinned.start is not None and pinned.start.kind == "zygote"
    assert proc_status(pinned.pid, "Cpus_allowed_list") == str(cluster.cpu)
    assert cluster.http.post("/v1/enforce/Pinned.cpus", json={}).json() == [cluster.cpu]  # on its model thread


def test_a_sandboxed_replica_holds_its_own_gpus_device_nodes_forked_from_a_zygote_that_holds_them(
        cluster: Cluster) -> None:
    # As on a real GPU node: the stand-ins of its GPU's node and the shared ones at /dev/<name>, no other GPU's.
    assert cluster.http.post("/v1/enforce/far", json={}).json() == sorted(["nvidia1", *SHARED_NODES])  # the L4
    held = wait_for(lambda: (r := replica(cluster, "Held")).state == "ready" and r, 60, "Held's replica to be ready")
    assert cluster.http.post("/v1/enforce/Held.nodes", json={}).json() == sorted(["nvidia0", *SHARED_NODES])
    # Held, a snap setup, was forked from a zygote whose sandbox holds its GPU's device nodes alone: the one the
    # preloader told the node, that of Held's replica (the H100, nvidia0), not the L4's.
    assert held.node_id == NODE and held.start is not None and held.start.kind == "zygote"

    def reported() -> tuple[dict[str, Any], str] | None:  # the zygote, once its node's report after the fork says so
        (node,) = [n for n in cluster.transport.json("GET", "/v1/status")["nodes"] if n["node_id"] == NODE]
        h100 = next(d["uuid"] for d in node["devices"] if d["kind"] == "gpu" and d["index"] == 0)
        return next(((z, h100) for z in node["zygotes"] if z["service"] == "Held" and z["forks"]), None)

    zygote, h100 = wait_for(reported, 30, "the node to report Held's zygote")
    assert zygote["gpus"] == [h100]
    assert proc_status(held.pid, "Cpus_allowed_list") == str(cluster.cpu)  # pinned all the same


def test_a_replica_over_its_gpu_memory_reservation_is_restarted_with_an_event(cluster: Cluster) -> None:
    before = replica(cluster, "hog")
    assert before.state == "ready"
    # 5000 MB in the replica and 4318 MB in its worker: each within the 8 GB reservation, together over it.
    inside = cluster.http.post("/v1/enforce/hog", json={"own_mb": 5000, "worker_mb": 4318}).json()
    assert len(inside) == 2  # the replica and its worker, by their pids in the sandbox
    pids = process_trees([before.pid])[before.pid]  # the same, and the sandbox's init, as the node sees them
    # (unless the agent, which acts as soon as its watch sees the sum, stopped the whole sandbox already)
    assert before.pid in pids and (len(pids) >= 2 or gone(before.pid))

    def event() -> list[dict[str, object]]:
        lines = cluster.transport.json("GET", "/v1/apps/enforce/logs", params={"service": "hog", "limit": 5000})
        return [line for line in lines if line["stream"] == "agent"]

    (line,) = wait_for(event, 60, "the agent's restart event")
    assert line["replica_id"] == before.replica_id
    assert line["line"] == (f"replica {before.replica_id} used 9.1 GB of GPU memory on GPU-enf-0, "
                            "reserved 8.0 GB: restarting")
    after = wait_for(lambda: (r := replica(cluster, "hog")).state == "ready" and r.pid != before.pid and r, 60,
                     "the restarted replica to be ready")
    assert after.restarts == before.restarts + 1 and after.restart_reason == line["line"]
    wait_for(lambda: all(gone(pid) for pid in pids), 30, "the replica's worker (its whole sandbox) to go with it")
    assert proc_status(after.pid, "Cpus_allowed_list") == str(cluster.cpu)  # pinned again
    agent_log = (cluster.platform.log_dir / f"agent-{NODE}.log").read_text()
    assert f"ERROR {line['line']} (enforced restart 1)" in agent_log
    # A replica within its reservation stays: far shares nothing, and the new hog declares nothing.
    assert replica(cluster, "far").restarts == 0
