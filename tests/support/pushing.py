"""Pushing an app whose manifest is read on this machine (its packages are all here), without the image plan."""

from __future__ import annotations

from pathlib import Path

import msgspec

from ember._bundle import build_bundle
from ember._client import Transport
from ember._deploy import inspect_app, wait_ready
from ember.wire import AppView, Deployment, DeployRequest, encoder


def push_here(transport: Transport, path: Path, app_name: str, timeout_s: float = 120.0) -> AppView:
    """Deploy ``app_name`` of ``path`` and wait for its replicas, as ``ember push`` does for an app without images."""
    manifest = inspect_app(path, app_name)
    bundle = build_bundle(path.parent)
    transport.request("PUT", f"/v1/bundles/{bundle.sha256}", content=bundle.data,
                      headers={"content-type": "application/gzip"})
    body = encoder.encode(DeployRequest(bundle_sha256=bundle.sha256, manifest=manifest))
    dep = msgspec.json.decode(transport.request("POST", f"/v1/apps/{manifest.app}/deployments", content=body,
                                                headers={"content-type": "application/json"}).content, type=Deployment)
    return wait_ready(transport, dep.app, dep.version, timeout_s=timeout_s, progress=lambda _msg, _view: None)
