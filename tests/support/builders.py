"""Builders of wire values with the defaults the unit tests share: app "a", service "s", version 1."""

from __future__ import annotations

from typing import Any

from ember.wire import Deployment, FunctionSpec, Manifest, ServiceSpec, SlotAssignment


def service_spec(name: str = "s", **fields: Any) -> ServiceSpec:
    """A function service ``name`` with one input-less function of the same name; ``fields`` set the rest."""
    return ServiceSpec(name=name, kind="function", functions=[FunctionSpec(name=name, attr=name, input_mode="none")],
                       **fields)


def deployment(*services: ServiceSpec, version: int = 1, **fields: Any) -> Deployment:
    """Version ``version`` of app "a" (module "m") deploying ``services``."""
    return Deployment(app="a", version=version, bundle_sha256="x", created_at=0.0,
                      manifest=Manifest(app="a", module="m", services=list(services)), **fields)


def slot(replica_id: str, *gpus: str, service: str = "s", version: int = 1, index: int = 0, app: str = "a",
         **fields: Any) -> SlotAssignment:
    """The slot of replica ``replica_id`` of ``app`` on the GPUs (or MIG slices) ``gpus``, none for a CPU one."""
    return SlotAssignment(replica_id=replica_id, app=app, service=service, version=version, index=index,
                          gpu_uuids=list(gpus), **fields)
