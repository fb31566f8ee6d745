"""GPU replicas on a sandboxed node fork from a zygote of their GPUs, on the real platform: the node is a node agent
with a declared (virtual) inventory of two whole GPUs, whose sandboxes bind each replica's own GPU's device node (the
agent's stand-ins). The version's first replica forks from a zygote that holds its GPU; the control plane then moves
the zygote to the GPU the next replica would get, and a scale-up there forks from it too. Each forked replica sees
its own GPU's device node and no other's."""

from __future__ import annotations

import httpx
import msgspec
import pytest
from support.platform import with_virtual_gpus
from support.polling import wait_for

import ember
from ember._client import Transport
from ember.wire import NodeView, StatusView

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

APP = '''import os
import ember
app = ember.App("gpu-snaps")

@app.model(gpu=1, min_replicas=1, max_replicas=2)
class Twin:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.weights = [0.5] * 1000  # in host memory, in the zygote: no GPU is touched before the fork

    @ember.method
    def where(self) -> list[str]:
        """Its GPU, and the GPU device nodes its sandbox holds."""
        return [os.environ["CUDA_VISIBLE_DEVICES"], *sorted(n for n in os.listdir("/dev") if n[6:].isdigit()
                                                               and n.startswith("nvidia"))]
'''
INVENTORY = '[host]\nname = "z"\n[[gpu]]\nmodel = "A10G-24GB"\ncount = 2\n'


def node_z(http: httpx.Client) -> NodeView | None:
    response = http.get("/v1/status")
    assert response.status_code == 200, response.text
    return next((n for n in msgspec.json.decode(response.content, type=StatusView).nodes if n.node_id == "node-z"),
                None)


def zygote_gpus(http: httpx.Client) -> list[str] | None:
    """The GPUs of Twin's zygote on node-z, once it is ready; None before."""
    node = node_z(http)
    return next((z.gpus for z in node.zygotes if z.service == "Twin" and z.state == "ready"), None) if node else None


def test_gpu_replicas_in_sandboxes_fork_from_a_zygote_of_their_own_gpus(tmp_path) -> None:
    app_file = tmp_path / "gpu_snaps.py"
    app_file.write_text(APP)
    with with_virtual_gpus(tmp_path, "node-z", INVENTORY) as (platform, http):
        transport = Transport(platform.url, token=platform.token)
        try:
            wait_for(lambda: (n := node_z(http)) is not None and len([d for d in n.devices if d.kind == "gpu"]) == 2,
                     60, "node-z to report its GPUs")
            node = node_z(http)
            assert node is not None and node.sandbox.startswith("bwrap"), node
            index = {d.uuid: d.index for d in node.devices if d.kind == "gpu"}
            ember.deploy(app_file, transport=transport, timeout_s=120)

            first, *nodes = http.post("/v1/gpu-snaps/Twin.where").json()
            assert nodes == [f"nvidia{index[first]}"]  # its own GPU's device node, no other's
            (other,) = set(index) - {first}
            starts = [(r.gpu_uuids, r.start.kind if r.start else "") for r in node_z(http).replicas]  # type: ignore[union-attr]
            assert starts == [([first], "zygote")], starts
            # The zygote goes where the next replica would: the other GPU, built again there.
            wait_for(lambda: zygote_gpus(http) == [other], 60, "the zygote to hold the other GPU",
                     explain=lambda: str(node_z(http)))

            assert http.post("/v1/apps/gpu-snaps/scale", json={"service": "Twin", "min_replicas": 2,
                                                              "max_replicas": 2}).status_code == 200

            def both() -> list[tuple[list[str], str]] | None:
                node = node_z(http)
                ready = [(r.gpu_uuids, r.start.kind if r.start else "") for r in node.replicas if r.state == "ready"] \
                    if node else []
                return sorted(ready) if len(ready) == 2 else None

            assert wait_for(both, 60, "a second replica") == sorted([([first], "zygote"), ([other], "zygote")])
            seen = {tuple(http.post("/v1/gpu-snaps/Twin.where").json()) for _ in range(20)}
            assert seen <= {(first, f"nvidia{index[first]}"), (other, f"nvidia{index[other]}")}, seen
            assert (other, f"nvidia{index[other]}") in seen
        finally:
            transport.close()
