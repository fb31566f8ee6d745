"""Replicas on a real GPU, as production runs them: marked ``gpu``, run where the machine has an NVIDIA GPU and
skipped elsewhere, saying why (bench/gpu/check.sh runs them on a lent GPU machine).

The session's platform reads its node's GPUs through NVML (no declared inventory). `ember push` of an app with
``gpu=1``: its replica is forked from a zygote that loaded the model on the CPU, is given the GPU (its device node
in the sandbox, CUDA_VISIBLE_DEVICES), runs the model there with the CPU's answers, and the node reports the GPU
with the replica assigned to it and the memory the replica's CUDA context holds.
"""

from __future__ import annotations

import runpy
import shutil
import subprocess

import httpx
import pytest
from support.paths import REPO
from support.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.gpu,
              pytest.mark.skipif("not nvidia_gpus()", reason="needs an NVIDIA GPU (nvidia-smi lists none)")]

APP = REPO / "tests" / "apps" / "gpu" / "gpu_probe.py"
ROWS = [[float(i + j) / 10 for j in range(8)] for i in range(5)]


def nvidia_gpus() -> int:
    """How many GPUs ``nvidia-smi -L`` lists (0 without a driver)."""
    if not shutil.which("nvidia-smi"):
        return 0
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(line.startswith("GPU ") for line in done.stdout.splitlines()) if done.returncode == 0 else 0


@pytest.fixture(scope="module")
def pushed(platform, ember_cli) -> None:
    pytest.importorskip("torch")
    ember_cli("push", str(APP), url=platform.url)


def test_a_replica_given_a_gpu_runs_its_model_there_with_the_cpus_answers(pushed: None, http: httpx.Client) -> None:
    import torch

    answers = [http.post("/v1/gpu-probe/Probe.forward", json={"x": row}) for row in ROWS]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    bodies = [a.json() for a in answers]
    assert {b["device"] for b in bodies} == {"cuda:0"}, bodies
    assert all(b["visible"] for b in bodies), bodies  # the node named the GPU it gave the replica
    net = runpy.run_path(str(APP))["build"]().eval()  # the same seeded weights, on the CPU here
    with torch.inference_mode():
        expected = net(torch.tensor(ROWS, dtype=torch.float32)).tolist()
    for body, want in zip(bodies, expected, strict=True):
        assert body["y"] == pytest.approx(want, rel=1e-3, abs=1e-4)


def test_the_node_reports_its_gpu_with_the_replica_on_it(pushed: None, http: httpx.Client) -> None:
    def placed() -> tuple[dict, dict] | None:
        status = http.get("/v1/status").json()
        for node in status["nodes"]:
            gpus = {d["uuid"]: d for d in node["devices"] if d["kind"] == "gpu"}
            for replica in node["replicas"]:
                if replica["app"] == "gpu-probe" and replica["state"] == "ready" and replica["gpu_uuids"]:
                    return gpus[replica["gpu_uuids"][0]], replica
        return None

    gpu, replica = wait_for(placed, timeout_s=60, what="the gpu-probe replica ready on a GPU")
    assert gpu["memory_total_mb"] > 0 and gpu["name"], gpu  # read through NVML, not declared
    assert replica["replica_id"] in gpu["replicas"], (gpu, replica)
