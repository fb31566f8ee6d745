"""``GET /metrics``: the replicas' reported counters in the Prometheus text format.

Names follow Prometheus practice: an ``ember_`` prefix, base units (seconds), ``_total`` on counters,
and ``app``/``function``/``replica`` labels (no per-call labels).
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.requests import Request
from starlette.responses import Response

from ember.wire import FunctionStats, Histogram, ReplicaStatus
from ember_platform.gateway.guard import principal_of
from ember_platform.gateway.responses import platform_of

_COUNTERS = (
    ("ember_calls_total", "calls", "Calls run by the replica's batcher."),
    ("ember_batches_total", "batches", "Batches run."),
    ("ember_calls_expired_total", "expired", "Calls whose deadline passed in the queue; never run."),
    ("ember_calls_rejected_total", "rejected", "Calls refused: queue full or deadline predicted to be missed."),
    ("ember_calls_cancelled_total", "cancelled", "Queued calls dropped because their caller went away."),
    ("ember_calls_failed_total", "failed", "Calls answered with an error from user code."),
)
_GAUGES = (
    ("ember_queue_depth", "queue_depth", "Calls waiting in the replica's batcher."),
    ("ember_batch_fill_ratio", "fill_ratio", "Mean batch size over max_size."),
)
_HISTOGRAMS = (
    ("ember_batch_size", "batch_size", "Calls per batch."),
    ("ember_queue_wait_seconds", "queue_wait_s", "Time from a call's arrival at the replica to its batch's start."),
    ("ember_batch_run_seconds", "run_s", "Time a batch ran on the executor."),
)


def render(replicas: Iterable[ReplicaStatus]) -> str:
    replicas_seen = list(replicas)
    rows = [(r, f) for r in replicas_seen for f in r.functions]
    lines: list[str] = []
    for name, attr, help_text in _COUNTERS:
        _family(lines, name, "counter", help_text, [(_labels(r, f), getattr(f, attr)) for r, f in rows])
    for name, attr, help_text in _GAUGES:
        _family(lines, name, "gauge", help_text, [(_labels(r, f), getattr(f, attr)) for r, f in rows])
    for name, attr, help_text in _HISTOGRAMS:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} histogram")
        for r, f in rows:
            _histogram(lines, name, _labels(r, f), getattr(f, attr))
    _start_phases(lines, list(replicas_seen))
    return "\n".join(lines) + "\n"


_PHASES = ("fetch_s", "interpreter_s", "imports_s", "snap_setup_s", "fork_s", "setup_s", "ready_s", "first_call_s")


def _start_phases(lines: list[str], replicas: list[ReplicaStatus]) -> None:
    samples = []
    for r in replicas:
        if r.start is None:
            continue
        labels = f'app="{r.app}",service="{r.service}",replica="{r.replica_id}",kind="{r.start.kind}"'
        for phase in _PHASES:
            value = getattr(r.start, phase)
            if value is not None:
                samples.append((f'{labels},phase="{phase.removesuffix("_s")}"', value))
    _family(lines, "ember_replica_start_seconds", "gauge",
            "Where each replica's start went, from the decision to start it (phase ready: all together).", samples)


def _family(lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    lines.extend(f"{name}{{{labels}}} {_num(value)}" for labels, value in samples)


def _histogram(lines: list[str], name: str, labels: str, hist: Histogram) -> None:
    cumulative = 0
    for bound, count in zip([*hist.bounds, float("inf")], hist.counts, strict=True):
        cumulative += count
        le = "+Inf" if bound == float("inf") else _num(bound)
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {cumulative}')
    lines.append(f"{name}_sum{{{labels}}} {_num(hist.sum)}")
    lines.append(f"{name}_count{{{labels}}} {hist.count}")


def _labels(replica: ReplicaStatus, stats: FunctionStats) -> str:
    return f'app="{replica.app}",function="{stats.function}",replica="{replica.replica_id}"'


def _num(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) and not value.is_integer() else str(int(value))


async def metrics(request: Request) -> Response:
    registry = platform_of(request).registry
    principal = principal_of(request)
    replicas = [r for app in sorted(registry.deployments.items) if principal.sees(app)
                for r in registry.live_replicas(app)]
    return Response(render(replicas), media_type="text/plain; version=0.0.4")

