"""A GPU whose driver reports a critical Xid error is taken out of service on the real platform: the replica on
it moves to another GPU while every call is served, nothing more is placed on it, and status, the CLI, the console's
data and ``/metrics`` say so. The node is a node agent with a declared (virtual) inventory of two GPUs, whose
virtual driver reports Xid errors through a file of its state directory (``ember_runtime.agent.gpu_faults``)."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import msgspec
import pytest
from support.browser import console_page
from support.platform import with_virtual_gpus
from support.polling import wait_for

import ember
from ember._client import Transport
from ember.wire import DeviceView, ServiceStatus, StatusView

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

APP = '''import os
import ember
app = ember.App("faults")

@app.function(gpu=1, min_replicas=1, max_replicas=2)
def where() -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")

@app.function()
def sees(path: str) -> bool:
    return os.path.exists(path)
'''
INVENTORY = '[host]\nname = "f"\n[[gpu]]\nmodel = "A10G-24GB"\ncount = 2\n'


def status(http: httpx.Client) -> StatusView:
    response = http.get("/v1/status")
    assert response.status_code == 200, response.text
    return msgspec.json.decode(response.content, type=StatusView)


def gpus(http: httpx.Client) -> dict[str, DeviceView]:
    nodes = {n.node_id: n for n in status(http).nodes}
    return {d.uuid: d for d in nodes["node-f"].devices if d.kind == "gpu"} if "node-f" in nodes else {}


def where(http: httpx.Client) -> ServiceStatus:
    return next(s for s in status(http).services if (s.app, s.service) == ("faults", "where"))


def test_a_gpu_with_a_critical_xid_error_is_taken_out_of_service_and_its_replica_moves(tmp_path) -> None:
    app_file = tmp_path / "faults.py"
    app_file.write_text(APP)
    with with_virtual_gpus(tmp_path, "node-f", INVENTORY) as (platform, http):
        xids = platform.state_dir / "node-node-f" / "gpu-xids"  # the virtual driver's reports
        transport = Transport(platform.url, token=platform.token)
        try:
            wait_for(lambda: len(gpus(http)) == 2, 60, "node-f to report its GPUs")
            ember.deploy(app_file, transport=transport, timeout_s=120)
            first = http.post("/v1/faults/where").json()
            (other,) = set(gpus(http)) - {first}
            assert http.post("/v1/faults/sees", json=str(xids)).json() is False  # no replica sees the file

            xids.write_text(f"{other} 13\n")  # an application's own error: reported, and the GPU stays in service
            wait_for(lambda: gpus(http)[other].xid == 13, 30, "Xid 13 in the node's report")
            assert gpus(http)[other].fault == "" and http.post("/v1/faults/where").json() == first

            with xids.open("a") as file:
                file.write(f"{first} 79\n")  # fallen off the bus
            statuses: list[int] = []

            def moved() -> bool:
                answer = http.post("/v1/faults/where", timeout=60)
                statuses.append(answer.status_code)
                return answer.status_code == 200 and answer.json() == other

            wait_for(moved, 90, "a replica on the other GPU", every_s=0.2)
            assert set(statuses) == {200}, statuses  # every call made meanwhile was served
            faulty = gpus(http)[first]
            assert faulty.xid == 79 and faulty.fault.startswith("Xid 79 at ")
            wait_for(lambda: not gpus(http)[first].replicas and len(gpus(http)[other].replicas) == 1, 60,
                     "the replica on the faulty GPU to leave")
            assert f"({first}) of node node-f reported Xid 79 at " in where(http).replaced
            assert {http.post("/v1/faults/where").json() for _ in range(5)} == {other}

            shown = subprocess.run([sys.executable, "-m", "ember.cli", "status", "faults"], capture_output=True,
                                   text=True, timeout=60, check=True, env={**os.environ, "EMBER_URL": platform.url,
                                                                           "EMBER_TOKEN": platform.token}).stdout
            assert "OUT OF SERVICE (Xid 79 at " in shown and "replaced a replica at " in shown
            metrics = http.get("/metrics").text
            assert any(line.startswith("DCGM_FI_DEV_XID_ERRORS{") and f'UUID="{first}"' in line
                       and line.endswith(" 79.0") for line in metrics.splitlines())
            assert f'ember_gpu_out_of_service{{gpu_uuid="{first}",mig_profile="",node="node-f"}} 1.0' in metrics
            assert 'ember_replicas_replaced_total{app="faults",reason="gpu",service="where"} 1.0' in metrics
            with console_page() as (page, problems):
                page.goto(f"{platform.url}/ui#token={platform.token}")
                fault = page.wait_for_selector('[data-node="node-f"] .device .fault', timeout=30_000)
                assert fault is not None and fault.inner_text().startswith("out of service: Xid 79 at ")
                assert page.locator('[data-node="node-f"] .device .fault').count() == 1
            assert problems == []

            # Nothing more is placed on it: a second replica has no GPU to go to.
            assert http.post("/v1/apps/faults/scale", json={"service": "where", "min_replicas": 2,
                                                            "max_replicas": 2}).status_code == 200
            wait_for(lambda: where(http).unschedulable != "", 60, "the second replica to be unschedulable",
                     explain=lambda: str(where(http)))
            assert not gpus(http)[first].replicas and where(http).ready == 1
        finally:
            transport.close()
