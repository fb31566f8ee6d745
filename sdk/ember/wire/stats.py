"""What ``GET /v1/stats`` shows: each function's recent call rate and latency quantiles, as the gateway measured
them (the web console draws its charts from it)."""

from __future__ import annotations

import msgspec


class TrafficPoint(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One interval: its end (unix seconds), calls per second, the share answered with an error (4xx/5xx), and
    the p50 and p99 of the calls' time at the gateway (seconds; 0 when no call ended in the interval)."""

    t: float
    rate: float
    error_rate: float
    p50_s: float
    p99_s: float


class FunctionTraffic(msgspec.Struct, frozen=True, kw_only=True):
    app: str
    function: str
    calls: int  # answered since the control plane started (this process)
    errors: int
    points: list[TrafficPoint]  # oldest first


class StatsView(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/stats``: the functions of the apps the token sees that were called while the history was kept."""

    now: float
    interval_s: float
    functions: list[FunctionTraffic]
