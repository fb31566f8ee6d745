"""Replicas on a real GPU, as production runs them: marked ``gpu``, run where the machine has an NVIDIA GPU and
skipped elsewhere, saying why (bench/gpu/check.sh runs them on a lent GPU machine).

The session's platform reads its node's GPUs through NVML (no declared inventory). `ember push` of an app with
``gpu=1`` whose snap setup loads its model on the CPU (tests/apps/gpu): each replica is given the GPU (its device
nodes in the sandbox, CUDA_VISIBLE_DEVICES naming it), runs the model there with the CPU's answers, and the node
reports the GPU with the replica on it and the GPU memory the replica's CUDA context holds. Scaled to two, the
second replica too, whether it forked from the zygote or not: on a sandboxed node a forked replica's zygote holds its
GPU's device nodes (``ZygoteAssignment.gpus``), and CUDA, untouched in the zygote, starts in the fork.
"""

from __future__ import annotations

import runpy
import shutil
import subprocess

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.lazy import torch
from support.paths import REPO
from support.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.gpu,
              pytest.mark.skipif("not nvidia_gpus()", reason="needs an NVIDIA GPU (nvidia-smi lists none)")]

APP = REPO / "tests" / "apps" / "gpu" / "gpu_probe.py"
ROWS = [[float(i + j) / 10 for j in range(8)] for i in range(5)]


def nvidia_gpus() -> int:
    """How many GPUs ``nvidia-smi -L`` lists (0 without a driver): the device, as ``make test`` decides on the gpu
    extra, not ``support.lazy.cuda()``, so that a GPU host whose torch cannot use it fails here rather than skips."""
    if not shutil.which("nvidia-smi"):
        return 0
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(line.startswith("GPU ") for line in done.stdout.splitlines()) if done.returncode == 0 else 0


@pytest.fixture(scope="module")
def pushed(platform, ember_cli) -> None:
    ember_cli("push", str(APP), url=platform.url)


def on_gpus(http: httpx.Client, count: int) -> list[tuple[dict, dict, str]]:
    """(its GPU, the replica, its node's sandbox) for ``count`` ready replicas of gpu-probe, each on a GPU."""
    def ready() -> list[tuple[dict, dict, str]] | None:
        found = []
        for node in http.get("/v1/status").json()["nodes"]:
            gpus = {d["uuid"]: d for d in node["devices"] if d["kind"] == "gpu"}
            found += [(gpus[r["gpu_uuids"][0]], r, node["sandbox"]) for r in node["replicas"]
                      if r["app"] == "gpu-probe" and r["state"] == "ready" and r["gpu_uuids"]]
        return found if len(found) >= count else None

    return wait_for(ready, timeout_s=120, what=f"{count} gpu-probe replica(s) ready on a GPU")


def gpu_memory_used(http: httpx.Client, replica_id: str) -> float | None:
    """The GPU memory ``/metrics`` says the replica's processes use (its node's NVML samples); None while none."""
    for family in text_string_to_metric_families(http.get("/metrics").text):
        if family.name == "ember_replica_gpu_memory_used_bytes":
            return sum(s.value for s in family.samples if s.labels.get("replica") == replica_id) or None
    return None


def answers(http: httpx.Client) -> list[dict]:
    replies = [http.post("/v1/gpu-probe/Probe.forward", json={"x": row}) for row in ROWS]
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    return [r.json() for r in replies]


def test_a_replica_given_a_gpu_runs_its_model_there_with_the_cpus_answers(pushed: None, http: httpx.Client) -> None:
    ((gpu, replica, _),) = on_gpus(http, 1)
    assert gpu["memory_total_mb"] > 0 and gpu["name"], gpu  # read through NVML, not declared
    assert replica["replica_id"] in gpu["replicas"], (gpu, replica)
    bodies = answers(http)
    assert {b["device"] for b in bodies} == {"cuda:0"}, bodies
    assert {b["visible"] for b in bodies} == {",".join(replica["gpu_uuids"])}, bodies  # the GPU it was given
    net = runpy.run_path(str(APP))["build"]().eval()  # the same seeded weights, on the CPU here
    with torch.inference_mode():
        expected = net(torch.tensor(ROWS, dtype=torch.float32)).tolist()
    for body, want in zip(bodies, expected, strict=True):
        assert body["y"] == pytest.approx(want, rel=1e-3, abs=1e-4)
    used = wait_for(lambda: gpu_memory_used(http, replica["replica_id"]), timeout_s=30,
                    what="the replica's GPU memory in /metrics")
    assert used > 0  # its CUDA context, found among the GPU's processes by its pid on the node


def test_a_second_replica_reaches_its_gpu_too_forked_or_not(pushed: None, http: httpx.Client, platform,
                                                            ember_cli) -> None:
    ember_cli("scale", "gpu-probe.Probe", "--min", "2", "--max", "2", url=platform.url)
    try:
        replicas = on_gpus(http, 2)
        zygote_gpus = {z["version"]: z["gpus"] for node in http.get("/v1/status").json()["nodes"]
                       for z in node["zygotes"] if z["app"] == "gpu-probe"}
        for gpu, replica, sandbox in replicas:
            if sandbox.startswith("bwrap") and (replica.get("start") or {}).get("kind") == "zygote":
                assert zygote_gpus.get(replica["version"]) in (None, [gpu["uuid"]]), (replica, zygote_gpus)
        assert {b["device"] for b in answers(http)} == {"cuda:0"}
    finally:
        ember_cli("scale", "gpu-probe.Probe", "--min", "1", "--max", "1", url=platform.url)
