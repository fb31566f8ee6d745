"""Quotas: limits on what the apps an app pattern matches may hold (replicas, GPU memory) and on the calls made to
them, or with one token (concurrent calls, request rate), and the bodies of ``/v1/quotas``.

A quota is kept in the ``ember_quotas`` bucket under its name and mirrored in memory by every control plane.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec
from msgspec import Meta

from ember.wire.bounds import AppPattern, TokenId

QUOTA_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
MAX_COUNT = 1_000_000  # replicas, concurrent calls, burst
MAX_GPU_MEMORY_MB = 1 << 40
MAX_RATE_PER_S = 1_000_000.0


class QuotaRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``PUT /v1/quotas/<name>`` (``ember quota set``): one subject, ``apps`` (an app name or glob, as a token's app
    patterns: ``team-a-*``) or ``token`` (a token's id), and at least one limit. ``max_replicas`` and
    ``max_gpu_memory_mb`` hold for an apps quota only; ``burst`` goes with ``rate_per_s`` (default: one second's
    worth, at least 1)."""

    apps: AppPattern | None = None
    token: TokenId | None = None
    max_replicas: Annotated[int, Meta(ge=0, le=MAX_COUNT)] | None = None
    max_gpu_memory_mb: Annotated[int, Meta(ge=0, le=MAX_GPU_MEMORY_MB)] | None = None
    max_concurrent_calls: Annotated[int, Meta(ge=0, le=MAX_COUNT)] | None = None
    rate_per_s: Annotated[float, Meta(gt=0, le=MAX_RATE_PER_S)] | None = None
    burst: Annotated[int, Meta(ge=1, le=MAX_COUNT)] | None = None


class Quota(msgspec.Struct, frozen=True, kw_only=True):
    """A quota as the ``ember_quotas`` bucket keeps it, under its name: a checked ``QuotaRequest``."""

    name: str
    apps: str | None = None
    token: str | None = None
    max_replicas: int | None = None
    max_gpu_memory_mb: int | None = None
    max_concurrent_calls: int | None = None
    rate_per_s: float | None = None
    burst: int | None = None
    created_at: float = 0.0
    created_by: str = ""  # the id of the token that set it


class QuotaUsage(msgspec.Struct, frozen=True, kw_only=True):
    """What a quota's subject holds now: replicas assigned and the GPU memory they reserve (a whole GPU counts as
    its total memory), and the calls in flight at the control plane that answered (calls are counted per control
    plane)."""

    replicas: int = 0
    gpu_memory_mb: int = 0
    calls_in_flight: int = 0


class QuotaView(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/quotas``: a quota and its usage."""

    quota: Quota
    usage: QuotaUsage
