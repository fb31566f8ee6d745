"""The Kubernetes manifests under deploy/kubernetes/, for the tests beside this file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from support.paths import REPO

K8S = REPO / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.33.0"  # the oldest release the manifests target: user namespaces on by default


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def manifest_files() -> list[Path]:
    """Every file of Kubernetes objects (the Helm values and the kustomization are not objects)."""
    return sorted(p for p in K8S.glob("*.yaml") if p.name not in ("kustomization.yaml", "nats-values.yaml"))


def find(kind: str, name: str) -> dict[str, Any]:
    for path in manifest_files():
        for doc in documents(path):
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise LookupError(f"no {kind} {name} under {K8S}")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod_spec(workload)
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        if c["name"] == name:
            return dict(c)
    raise LookupError(name)
