"""The scheduler across several node agents on this machine, each with a declared (virtual) GPU inventory:
GPU-aware placement, devices each replica sees, minimum replicas restored after a node is lost, and
replicas spread onto a node that joins later, make-before-break."""

from __future__ import annotations

import signal
import time

import pytest
from support.auth import authed_client
from support.platform import TestPlatform
from support.polling import wait_for

import ember
from ember._client import Transport
from ember._deploy import app_view

pytestmark = pytest.mark.integration

APP = '''import os
import ember
app = ember.App("gpus")

@app.function(gpu="H100", min_replicas=1)
def big() -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")

@app.function(gpu=1, min_replicas=2)
def anywhere() -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")
'''


def ready(transport: Transport, service: str) -> dict[str, str]:
    """replica id -> node id of the ready replicas of ``service``."""
    view = app_view(transport, "gpus")
    return {r.replica_id: r.node_id for s in view.services if s.name == service for r in s.replicas
            if r.state == "ready"}




def test_placement_across_nodes_and_recovery_from_node_loss(tmp_path):
    (tmp_path / "a.toml").write_text('nvlink = [[0, 1]]\n[host]\nname = "a"\n[[gpu]]\nmodel = "H100-80GB"\ncount = 2\n')
    (tmp_path / "b.toml").write_text('[host]\nname = "b"\n[[gpu]]\nmodel = "A10G-24GB"\ncount = 2\n')
    app_file = tmp_path / "gpus.py"
    app_file.write_text(APP)
    with TestPlatform(tmp_path / "state") as platform, authed_client(platform) as http:
        node_a = platform.add_agent("node-a", tmp_path / "a.toml")
        platform.add_agent("node-b", tmp_path / "b.toml")
        transport = Transport(platform.url, token=platform.token)
        try:
            # Both GPU nodes first, so that placement itself spreads (spreading later is the next test).
            def nodes() -> set[str]:
                return {n["node_id"] for n in transport.json("GET", "/v1/status")["nodes"]}

            wait_for(lambda: {"node-a", "node-b"} <= nodes(), 60, "both GPU nodes to report")
            ember.deploy(app_file, transport=transport, timeout_s=120)
            assert set(ready(transport, "big").values()) == {"node-a"}  # only node-a has an H100
            spread = wait_for(lambda: len(set(ready(transport, "anywhere").values())) == 2
                              and ready(transport, "anywhere"), 60, "anywhere's replicas on both GPU nodes")
            assert set(spread.values()) == {"node-a", "node-b"}  # spread, and never on the CPU node
            assert http.post("/v1/gpus/big").json().startswith("GPU-a-")  # it sees only its own GPU

            lost_at = time.monotonic()
            node_a.send_signal(signal.SIGKILL)  # its replicas die with it
            wait_for(lambda: list(ready(transport, "anywhere").values()).count("node-b") == 2, 90,
                     "a replacement ready on node-b")
            print(f"replacement ready {time.monotonic() - lost_at:.1f}s after the node was lost")
            wait_for(lambda: set(ready(transport, "anywhere").values()) == {"node-b"}, 30,
                     "the lost node's replicas to leave the view")
            devices = {http.post("/v1/gpus/anywhere").json() for _ in range(6)}
            assert devices <= {"GPU-b-0", "GPU-b-1"}
        finally:
            transport.close()


def test_replicas_spread_onto_a_node_that_joins_without_dropping_below_min(tmp_path):
    (tmp_path / "a.toml").write_text('[host]\nname = "a"\n[[gpu]]\nmodel = "A10G-24GB"\ncount = 2\n')
    (tmp_path / "b.toml").write_text('[host]\nname = "b"\n[[gpu]]\nmodel = "A10G-24GB"\ncount = 2\n')
    app_file = tmp_path / "gpus.py"
    app_file.write_text(APP.replace('gpu="H100", min_replicas=1', 'gpu="H100", min_replicas=0'))  # no H100 here
    with TestPlatform(tmp_path / "state") as platform:
        platform.add_agent("node-a", tmp_path / "a.toml")
        transport = Transport(platform.url, token=platform.token)
        try:
            wait_for(lambda: "node-a" in {n["node_id"] for n in transport.json("GET", "/v1/status")["nodes"]}, 60,
                     "node-a to report")
            ember.deploy(app_file, transport=transport, timeout_s=120)
            before = wait_for(lambda: len(ready(transport, "anywhere")) == 2 and ready(transport, "anywhere"), 60,
                              "two replicas ready")
            assert set(before.values()) == {"node-a"}  # the only GPU node: both replicas share it

            platform.add_agent("node-b", tmp_path / "b.toml")
            fewest = 2
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                now_ready = ready(transport, "anywhere")
                fewest = min(fewest, len(now_ready))
                if sorted(now_ready.values()) == ["node-a", "node-b"]:  # the replaced replica has gone
                    break
                time.sleep(0.2)
            else:
                raise AssertionError(f"replicas never spread onto node-b: {now_ready}")
            assert fewest >= 2, "a move stopped a replica before its replacement was ready"
            assert len(set(now_ready) & set(before)) == 1  # one replica moved, the other stayed
        finally:
            transport.close()
