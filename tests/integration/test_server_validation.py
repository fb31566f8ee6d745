"""The platform validates what it is sent, whatever sent it, and one broken service never stops the others.

Manifests and scale requests go through the same validator as the SDK's (``ember.wire.validate``); a service that
still cannot be reconciled (here: a deployment written straight into the KV bucket, past the API) is shown as
failed in ``GET /v1/status`` while the control loop keeps placing and scaling every other service.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import tarfile
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.natsconn import connect as admin_connect
from support.polling import wait_for

from ember._deploy import deploy
from ember.wire import Deployment, FunctionSpec, Manifest, ServiceSpec, StatusView, encoder, subjects

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GOOD_SERVICE = {"name": "f", "kind": "function", "functions": [{"name": "f", "attr": "f", "input_mode": "single"}]}


def deploy_request(app: str = "badapp", **service: Any) -> dict[str, Any]:
    return {"bundle_sha256": "0" * 64,
            "manifest": {"app": app, "module": "m", "services": [{**GOOD_SERVICE, **service}]}}


@pytest.mark.parametrize(("service", "field"), [
    ({"buffer_replicas": -1}, "$.manifest.services[0].buffer_replicas"),
    ({"scaledown_window_s": -5}, "$.manifest.services[0].scaledown_window_s"),
    ({"target_p95_ms": 0}, "$.manifest.services[0].target_p95_ms"),
    ({"gpu_count": 64}, "$.manifest.services[0].gpu_count"),
    ({"gpu_count": 1, "gpu_types": ["H100", "H100"]}, "$.manifest.services[0].gpu_types"),
    ({"min_replicas": 100000, "max_replicas": 100000}, "$.manifest.services[0].min_replicas"),
    ({"functions": [{"name": "f", "attr": "f", "input_mode": "single", "on": ["_INBOX.>"]}]},
     "$.manifest.services[0].functions[0].on[0]"),
    ({"functions": [{"name": "f", "attr": "f", "input_mode": "single", "on": ["ember.invoke.>"]}]},
     "$.manifest.services[0].functions[0].on[0]"),
    ({"functions": [{"name": "f", "attr": "f", "input_mode": "single", "on": ["orders.new"],
                     "result_subject": "ember.replica.x.invoke"}]},
     "$.manifest.services[0].functions[0].result_subject"),
])
def test_a_deployment_the_sdk_would_refuse_is_refused_by_the_server(http, service, field):
    response = http.post("/v1/apps/badapp/deployments", json=deploy_request(**service))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


@pytest.mark.parametrize(("bounds", "field"), [
    ({"min_replicas": 100000, "max_replicas": 100000}, "$.min_replicas"),
    ({"min_replicas": 0, "max_replicas": 100000}, "$.max_replicas"),
    ({"min_replicas": -1, "max_replicas": 1}, "$.min_replicas"),
])
def test_scale_bounds_are_bounded(hello, http, bounds, field):
    response = http.post("/v1/apps/hello/scale", json={"service": "greet", **bounds})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


APP = '''import ember
app = ember.App("isolated")

@app.function(min_replicas=0, max_replicas=2)
def ping() -> str:
    return "pong"
'''


# Services past the validator: one the autoscaler refuses, and one whose GPU request the scheduler cannot read
# (the quota step over every service at once read it, outside the isolation of each: no app was placed at all).
BROKEN = [({"buffer_replicas": -1}, "buffer_replicas"), ({"gpu_count": 1, "gpu_types": ["4090"]}, "types=['4090']")]


@pytest.mark.parametrize(("broken", "reason_names"), BROKEN)
def test_a_service_that_cannot_be_reconciled_is_failed_and_the_others_go_on(platform, transport, http, broken,
                                                                                reason_names, tmp_path: Path):
    (tmp_path / "isolated.py").write_text(APP)
    deploy(tmp_path / "isolated.py", transport=transport, timeout_s=120)
    broken = _broken_deployment(**broken)
    asyncio.run(_put_deployment(platform.nats_url, broken))
    try:
        def failure() -> str | None:
            answer = http.get("/v1/status", params={"app": "unreconcilable"})
            if answer.status_code == 404:  # the platform has not seen the deployment written past it yet
                return None
            view = msgspec.json.decode(answer.content, type=StatusView)
            return view.services[0].failure or None

        reason = wait_for(failure, timeout_s=30, what="the broken service to be marked failed")
        assert reason_names in reason
        # Every other service is still scaled: a replica of `isolated` is placed and becomes ready.
        assert http.post("/v1/apps/isolated/scale", json={"service": "ping", "min_replicas": 1,
                                                          "max_replicas": 2}).status_code == 200

        def ready() -> int | None:
            view = msgspec.json.decode(http.get("/v1/status", params={"app": "isolated"}).content, type=StatusView)
            return view.services[0].ready or None

        wait_for(ready, timeout_s=60, what="a replica of the healthy app")
        assert http.post("/v1/isolated/ping").json() == "pong"
    finally:
        assert http.delete("/v1/apps/unreconcilable").status_code == 204
        http.delete("/v1/apps/isolated")


def _broken_deployment(**fields: Any) -> Deployment:
    fn = FunctionSpec(name="f", attr="f", input_mode="none")
    svc = ServiceSpec(name="f", kind="function", functions=[fn], **fields)  # past the validator
    return Deployment(app="unreconcilable", version=1, bundle_sha256="0" * 64, created_at=time.time(),
                      manifest=Manifest(app="unreconcilable", module="m", services=[svc]))


async def _put_deployment(url: str, dep: Deployment) -> None:
    nc = await admin_connect(url)
    try:
        kv = await nc.jetstream().key_value(subjects.DEPLOYMENTS_BUCKET)
        await kv.put(dep.app, encoder.encode(dep))
    finally:
        await nc.close()


def _upload(http: Any, data: bytes) -> Any:
    return http.put(f"/v1/bundles/{hashlib.sha256(data).hexdigest()}", content=data)


def _archive(*members: tarfile.TarInfo) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for member in members:
            tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isreg() else None)
    return raw.getvalue()


def _link(name: str, kind: bytes, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize("member", [
    tarfile.TarInfo("../escape.py"), tarfile.TarInfo("/etc/cron.d/x"),
    _link("weights", tarfile.SYMTYPE, "/etc/shadow"), _link("weights", tarfile.LNKTYPE, "../../x"),
], ids=["parent", "absolute", "symlink-out", "hardlink-out"])
def test_a_bundle_with_a_member_outside_itself_is_refused_at_upload(http, member):
    response = _upload(http, _archive(member))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "$body" and "bundle member" in response.json()["error"]["message"]


def test_a_bundle_that_would_unpack_past_the_limit_is_refused_at_upload(http):
    header = tarfile.TarInfo("model.bin")
    header.size = 1 << 30  # declared: 1 GiB; sent: the header alone
    data = gzip.compress(header.tobuf(format=tarfile.PAX_FORMAT))
    response = _upload(http, data)
    assert response.status_code == 413, response.text
    assert "unpacks to more than" in response.json()["error"]["message"]
    assert _upload(http, b"not a bundle").status_code == 422


def test_a_bundle_a_node_cannot_fetch_is_reported_on_the_replica_and_retried_with_backoff(platform, http):
    fn = FunctionSpec(name="f", attr="f", input_mode="none")
    svc = ServiceSpec(name="f", kind="function", functions=[fn], min_replicas=1, max_replicas=1)
    missing = Deployment(app="nobundle", version=1, bundle_sha256="ab" * 32, created_at=time.time(),
                         manifest=Manifest(app="nobundle", module="m", services=[svc]))
    asyncio.run(_put_deployment(platform.nats_url, missing))  # past the API, which refuses an unknown bundle
    try:
        def reason() -> str | None:
            answer = http.get("/v1/apps/nobundle")
            if answer.status_code == 404:  # the platform has not seen the deployment written past it yet
                return None
            replicas = answer.json()["services"][0]["replicas"]
            return next((r["message"] for r in replicas if "cannot fetch" in r["message"]), None)

        first = wait_for(reason, timeout_s=30, what="the fetch failure on the replica's status")
        assert "ababababab" in first and "attempt 1, next in 2s" in first
        wait_for(lambda: "attempt 3" in (reason() or ""), timeout_s=30, what="a third attempt, 2 s then 4 s later")
    finally:
        assert http.delete("/v1/apps/nobundle").status_code == 204


def test_an_input_pattern_the_gateway_cannot_match_in_linear_time_is_refused_at_deploy(http):
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "(a)\\1"}}}
    fn = {"name": "f", "attr": "f", "input_mode": "single", "input_schema": schema}
    response = http.post("/v1/apps/badapp/deployments", json=deploy_request(functions=[fn]))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "$.manifest.services[0].functions[0].input_schema.properties.s.pattern"
