"""Placement requests; the ``gpu=`` grammar itself lives in the SDK (``ember._resources``), since decorators
check it."""

from __future__ import annotations

from typing import Literal

import msgspec

from ember._resources import GpuRequest, Topology, parse_gpu
from ember.wire import ServiceSpec

Priority = Literal["interactive", "batch"]


class PlacementRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One replica to place: its id, its function, what it needs and what it may displace."""

    replica_id: str
    function: str
    gpu: GpuRequest = GpuRequest()
    cpu_millis: int = 1000
    host_memory_mb: int = 1024
    priority: Priority = "interactive"
    bundle: str = ""  # the bundle or snapshot key: nodes caching it are preferred
    volumes: tuple[str, ...] = ()  # the volumes it mounts (``name@vN``): nodes caching them are preferred
    environment: str = ""  # its image's environment (sha256): nodes that built it are preferred

__all__ = ["GpuRequest", "PlacementRequest", "Priority", "Topology", "parse_gpu", "request_from_spec"]


def request_from_spec(spec: ServiceSpec) -> GpuRequest:
    """The GPU request of a service: the full request where the manifest has one, else count and types."""
    if spec.gpu is not None:
        return spec.gpu
    return GpuRequest(count=spec.gpu_count, types=tuple(spec.gpu_types) if spec.gpu_count else ())
