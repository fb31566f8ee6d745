"""Placement requests; the ``gpu=`` grammar itself lives in the SDK (``ember._resources``)."""

from __future__ import annotations

from ember._resources import GpuRequest, PlacementRequest, Priority, Topology, parse_gpu
from ember.wire import ServiceSpec

__all__ = ["GpuRequest", "PlacementRequest", "Priority", "Topology", "parse_gpu", "request_from_spec"]


def request_from_spec(spec: ServiceSpec) -> GpuRequest:
    """The GPU request of a service: the full request where the manifest has one, else count and types."""
    if spec.gpu is not None:
        return spec.gpu
    return GpuRequest(count=spec.gpu_count, types=tuple(spec.gpu_types) if spec.gpu_count else ())
