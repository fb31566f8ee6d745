"""GPU replicas on a sandboxed node fork from a zygote of their GPUs, on the real platform: the node is a node agent
with a declared (virtual) inventory, whose sandboxes bind each replica's own GPU's device node (the agent's
stand-ins). On two whole GPUs, the version's first replica forks from a zygote that holds its GPU; the control plane
then moves the zygote to the GPU the next replica would get, and a scale-up there forks from it too. Each forked
replica sees its own GPU's device node and no other's. And a zygote never stays on a GPU that another app's replica
is given."""

from __future__ import annotations

import httpx
import msgspec
import pytest
from support.browser import console_page
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


def node_on(http: httpx.Client, node_id: str) -> NodeView | None:
    response = http.get("/v1/status")
    assert response.status_code == 200, response.text
    return next((n for n in msgspec.json.decode(response.content, type=StatusView).nodes if n.node_id == node_id),
                None)


def node_z(http: httpx.Client) -> NodeView | None:
    return node_on(http, "node-z")


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
            with console_page() as (page, problems):  # the console's node card shows it on that GPU's row
                page.goto(f"{platform.url}/ui#token={platform.token}")
                held = f'[data-node="node-z"] [data-device="{other}"] [data-zygote="gpu-snaps.Twin"]'
                chip = page.wait_for_selector(held, timeout=30_000)
                assert chip is not None and chip.inner_text() == "zygote gpu-snaps.Twin v1 ready"
                assert page.locator(f'[data-node="node-z"] [data-device="{first}"] [data-zygote]').count() == 0
            assert problems == []

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


SHARING = '''import ember
app = ember.App("{app}")

@app.model(gpu="A10G:4GB", min_replicas=1, max_replicas=2)
class Share:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.ready = True

    @ember.method
    def ok(self) -> bool:
        return self.ready
'''


def test_a_zygote_leaves_a_gpu_once_another_apps_replica_is_given_it(tmp_path) -> None:
    """One virtual GPU, shared by memory: app "mine" keeps a zygote on it until app "theirs" has a replica there;
    from then on no zygote of "mine" holds it (its code would run beside another tenant's on that GPU), and a
    scale-up of "mine" starts fresh instead."""
    apps = {}
    for name in ("mine", "theirs"):
        apps[name] = tmp_path / name / f"{name}_share.py"
        apps[name].parent.mkdir()
        apps[name].write_text(SHARING.format(app=name))
    one_gpu = '[host]\nname = "s"\n[[gpu]]\nmodel = "A10G-24GB"\n'
    with with_virtual_gpus(tmp_path, "node-s", one_gpu) as (platform, http):
        transport = Transport(platform.url, token=platform.token)

        def zygotes() -> dict[str, list[str]] | None:
            node = node_on(http, "node-s")
            return {z.app: z.gpus for z in node.zygotes if z.state == "ready"} if node else None

        try:
            wait_for(lambda: node_on(http, "node-s") is not None, 60, "node-s to report")
            ember.deploy(apps["mine"], transport=transport, timeout_s=120)
            (gpu,) = [d.uuid for d in node_on(http, "node-s").devices if d.kind == "gpu"]  # type: ignore[union-attr]
            wait_for(lambda: zygotes() == {"mine": [gpu]}, 60, "mine's zygote on the GPU")
            ember.deploy(apps["theirs"], transport=transport, timeout_s=120)
            wait_for(lambda: (held := zygotes()) is not None and "mine" not in held, 60,
                     "mine's zygote to leave the GPU", explain=lambda: str(node_on(http, "node-s")))
            assert http.post("/v1/apps/mine/scale", json={"service": "Share", "min_replicas": 2,
                                                         "max_replicas": 2}).status_code == 200

            def mine() -> list[str] | None:
                node = node_on(http, "node-s")
                kinds = [r.start.kind if r.start else "" for r in node.replicas if r.app == "mine"
                         and r.state == "ready"] if node else []
                return kinds if len(kinds) == 2 else None

            assert wait_for(mine, 60, "mine's second replica").count("zygote") <= 1  # the second did not fork
            assert "mine" not in (zygotes() or {})
        finally:
            transport.close()
