"""`ember status` and `ember scale` against a real platform and one node agent with a declared GPU inventory:
the node's GPUs and what replicas reserve on them, bounds changed at run time, and their validation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import msgspec
import pytest
from support.auth import authed_client
from support.platform import TestPlatform
from support.polling import wait_for

from ember._bundle import build_bundle
from ember._client import Transport
from ember._deploy import deploy, inspect_app, wait_ready
from ember.dev.embedded import EmbeddedPlatform
from ember.wire import DeployRequest, ServiceStatus, StatusView, encoder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
EMBER = [sys.executable, "-m", "ember.cli"]

APP = '''import os
import ember
app = ember.App("statusapp")

@app.function(gpu=1, min_replicas=1, max_replicas=2)
def where() -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")
'''
INVENTORY = '[host]\nname = "g"\n[[gpu]]\nmodel = "A10G-24GB"\ncount = 2\nmemory_used_gb = 1\n'
GPU_MB = 24 * 1024


def ember(*args: str, url: str, token: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*EMBER, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "EMBER_URL": url, "EMBER_TOKEN": token})
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc




def status(http: httpx.Client) -> StatusView:
    response = http.get("/v1/status")
    assert response.status_code == 200, response.text
    return msgspec.json.decode(response.content, type=StatusView)


def service(http: httpx.Client, app: str = "statusapp", name: str = "where") -> ServiceStatus:
    (found,) = [s for s in status(http).services if (s.app, s.service) == (app, name)]
    return found


def gpu_reserved(http: httpx.Client) -> list[int]:
    """Memory reserved on each GPU of node-g, in MB."""
    nodes = {n.node_id: n for n in status(http).nodes}
    return [d.memory_reserved_mb for d in nodes["node-g"].devices if d.kind == "gpu"] if "node-g" in nodes else []


def deploy_with_short_scaledown(app_file: Path, transport: Transport) -> None:
    """Deploy like ``ember push``, but with a 1 s scale-down window (not a decorator argument yet)."""
    manifest = inspect_app(app_file)
    services = [msgspec.structs.replace(s, scaledown_window_s=1.0) for s in manifest.services]
    manifest = msgspec.structs.replace(manifest, services=services)
    bundle = build_bundle(app_file.parent)
    transport.request("PUT", f"/v1/bundles/{bundle.sha256}", content=bundle.data)
    body = encoder.encode(DeployRequest(bundle_sha256=bundle.sha256, manifest=manifest))
    transport.request("POST", "/v1/apps/statusapp/deployments", content=body,
                      headers={"content-type": "application/json"})
    wait_ready(transport, "statusapp", 1, timeout_s=120, progress=lambda _msg, _view: None)


def test_status_shows_gpus_and_scale_changes_replicas(tmp_path: Path) -> None:
    (tmp_path / "g.toml").write_text(INVENTORY)
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "statusapp.py").write_text(APP)
    with TestPlatform(tmp_path / "state") as platform, authed_client(platform) as http:
        platform.add_agent("node-g", tmp_path / "g.toml")
        transport = Transport(platform.url, token=platform.token)
        try:
            deploy_with_short_scaledown(app_dir / "statusapp.py", transport)

            view = status(http)
            (node,) = [n for n in view.nodes if n.node_id == "node-g"]
            gpus = [d for d in node.devices if d.kind == "gpu"]
            assert [(d.name, d.memory_total_mb, d.memory_free_mb) for d in gpus] == [("A10G-24GB", GPU_MB,
                                                                                     GPU_MB - 1024)] * 2
            (held,) = [d for d in gpus if d.replicas]  # gpu=1 takes one GPU whole
            assert held.memory_reserved_mb == GPU_MB
            (replica,) = node.replicas
            assert (replica.replica_id, replica.state, replica.gpu_uuids) == (held.replicas[0], "ready", [held.uuid])
            svc = service(http)
            assert (svc.version, svc.min_replicas, svc.max_replicas, svc.scaled) == (1, 1, 2, False)
            assert (svc.ready, svc.desired, svc.unschedulable) == (1, 1, "")

            shown = ember("status", "statusapp", url=platform.url, token=platform.token).stdout
            assert "node-g" in shown and "1.0/24.0/24.0 GiB" in shown and "statusapp.where" in shown

            scaled = ember("scale", "statusapp.where", "--min", "2", "--max", "2", url=platform.url,
                           token=platform.token)
            assert "min 2, max 2" in scaled.stdout
            wait_for(lambda: service(http).ready == 2, 90, "two ready replicas")
            assert gpu_reserved(http) == [GPU_MB, GPU_MB]
            svc = service(http)
            assert (svc.min_replicas, svc.max_replicas, svc.scaled, svc.desired) == (2, 2, True, 2)

            # Down to one replica with min 1: with min 0, the 1 s scale-down window could take the second one
            # too before a status showed one (the two drain side by side and may end in one report).
            ember("scale", "statusapp.where", "--min", "1", "--max", "1", url=platform.url, token=platform.token)
            wait_for(lambda: sorted(gpu_reserved(http)) == [0, GPU_MB], 60, "down to one replica (max 1)",
                     explain=lambda: f"reserved {gpu_reserved(http)}, {service(http)}")
            assert service(http).ready == 1
            # With no load and min 0, the 1 s scale-down window takes it to zero.
            ember("scale", "statusapp.where", "--min", "0", "--max", "1", url=platform.url, token=platform.token)
            wait_for(lambda: gpu_reserved(http) == [0, 0] and service(http).ready == 0, 60, "down to zero",
                     explain=lambda: f"reserved {gpu_reserved(http)}, {service(http)}")
            assert service(http).desired == 0
        finally:
            transport.close()


@pytest.mark.parametrize(("body", "field"), [
    ({"service": "nope", "min_replicas": 1, "max_replicas": 1}, "$.service"),
    ({"service": "greet", "min_replicas": -1, "max_replicas": 1}, "$.min_replicas"),
    ({"service": "greet", "min_replicas": 3, "max_replicas": 2}, "$.max_replicas"),
    ({"service": "greet", "min_replicas": 0, "max_replicas": 0}, "$.max_replicas"),
    ({"service": "greet", "min_replicas": 1}, "$.max_replicas"),
    ({"service": "greet", "min_replicas": "1", "max_replicas": 1}, "$.min_replicas"),
])
def test_scale_validation_is_422_naming_the_field(http: httpx.Client, hello: object, body: dict[str, object],
                                                 field: str) -> None:
    response = http.post("/v1/apps/hello/scale", json=body)  # all invalid: the shared app is left as it is
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


def test_scale_and_status_of_unknown_app(http: httpx.Client, platform: EmbeddedPlatform) -> None:
    response = http.post("/v1/apps/nosuchapp/scale", json={"service": "f", "min_replicas": 1, "max_replicas": 1})
    assert response.status_code == 404
    assert http.get("/v1/status", params={"app": "nosuchapp"}).status_code == 404
    bad = ember("scale", "nosuchapp.f", "--min", "1", "--max", "1", url=platform.url, token=platform.token, check=False)
    assert bad.returncode == 1 and "NotFoundError" in bad.stderr


def test_cli_scale_reports_invalid_bounds(platform: EmbeddedPlatform, hello: object) -> None:
    bad = ember("scale", "hello.greet", "--min", "2", "--max", "1", url=platform.url, token=platform.token, check=False)
    assert bad.returncode == 1 and "InvalidInputError" in bad.stderr and "max_replicas" in bad.stderr


def test_a_control_plane_with_tokens_and_nats_credentials_reports_nothing_insecure(http: httpx.Client) -> None:
    """The twin of the bootstrap test's control plane without NATS credentials, whose status names what it lacks."""
    assert status(http).insecure == []


REBORN = '''import ember
app = ember.App("reborn")

@app.function(min_replicas=1, max_replicas=3)
def twice(x: int) -> int:
    return 2 * x
'''


def test_an_app_pushed_again_after_its_deletion_starts_afresh(tmp_path: Path, platform: EmbeddedPlatform,
                                                              http: httpx.Client) -> None:
    """What the control loop knew of a deleted app (its scaled count, its autoscaler's state) is not the next
    app's of its name: it starts at its own minimum."""
    app_file = tmp_path / "reborn.py"
    app_file.write_text(REBORN)
    transport = Transport(platform.url, token=platform.token)
    try:
        deploy(app_file, transport=transport, timeout_s=120)
        ember("scale", "reborn.twice", "--min", "2", "--max", "3", url=platform.url, token=platform.token)
        wait_for(lambda: service(http, "reborn", "twice").ready == 2, 60, "two ready replicas")
        assert http.delete("/v1/apps/reborn").status_code == 204
        wait_for(lambda: http.get("/v1/apps/reborn").status_code == 404, 30, "the app to go")
        deploy(app_file, transport=transport, timeout_s=120)
        svc = service(http, "reborn", "twice")
        assert (svc.min_replicas, svc.max_replicas, svc.scaled, svc.desired) == (1, 3, False, 1)
        assert http.post("/v1/reborn/twice", json=21).json() == 42
    finally:
        http.delete("/v1/apps/reborn")
        transport.close()
