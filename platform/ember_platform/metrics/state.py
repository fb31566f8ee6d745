"""What the control plane holds, as metric families built at scrape time (a ``prometheus_client`` collector).

Nothing here is counted on the call path: each scrape reads the replicas' last reports (their batchers' counters
and histograms, queue depths, start phases), the status view (replicas by state, the autoscaler's desired against
ready replicas, calls waiting in durable queues), the gateway's calls in flight, and the nodes' GPUs (``gpu``).
Counters reported by a replica start from zero when it restarts, as Prometheus expects of a counter.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from ember.wire import FunctionStats, Histogram, NodeInfo, ReplicaStatus, StatusView
from ember.wire.jetstream import REPLICA_TTL_S
from ember_platform.metrics import gpu

_FN = ["app", "function", "version", "replica"]
_COUNTERS = (
    ("ember_calls", "calls", "Calls run by a replica's batcher."),
    ("ember_batches", "batches", "Batches run."),
    ("ember_calls_expired", "expired", "Calls whose deadline passed in the queue; never run."),
    ("ember_calls_rejected", "rejected", "Calls refused: queue full or deadline predicted to be missed."),
    ("ember_calls_cancelled", "cancelled", "Queued calls dropped because their caller went away."),
    ("ember_calls_failed", "failed", "Calls answered with an error from user code."),
)
_GAUGES = (
    ("ember_queue_depth", "queue_depth", "Calls waiting in a replica's batcher."),
    ("ember_replica_in_flight", "in_flight", "Calls a replica holds: queued or running."),
    ("ember_batch_fill_ratio", "fill_ratio", "Mean batch size over max_size."),
)
_HISTOGRAMS = (
    ("ember_batch_size", "batch_size", "Calls per batch."),
    ("ember_queue_wait_seconds", "queue_wait_s", "Time from a call's arrival at the replica to its batch's start."),
    ("ember_batch_run_seconds", "run_s", "Time a batch ran on the executor."),
)
PHASES = ("fetch_s", "interpreter_s", "imports_s", "snap_setup_s", "fork_s", "setup_s", "ready_s", "first_call_s")
STATES = ("starting", "ready", "stopping", "crashed", "failed")


def replica_families(replicas: Iterable[ReplicaStatus]) -> Iterator[Metric]:
    """The batchers' counters, gauges and histograms per function and replica, replicas by state, start phases."""
    replicas = list(replicas)
    rows = [(r, f) for r in replicas for f in r.functions]
    for name, attr, doc in _COUNTERS:
        family = CounterMetricFamily(name, doc, labels=_FN)
        for r, f in rows:
            family.add_metric(_fn_labels(r, f), getattr(f, attr))
        yield family
    for name, attr, doc in _GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=_FN)
        for r, f in rows:
            gauge.add_metric(_fn_labels(r, f), getattr(f, attr))
        yield gauge
    for name, attr, doc in _HISTOGRAMS:
        hist = HistogramMetricFamily(name, doc, labels=_FN)
        for r, f in rows:
            h: Histogram = getattr(f, attr)
            hist.add_metric(_fn_labels(r, f), _buckets(h), h.sum)
        yield hist
    running = GaugeMetricFamily("ember_replica_running_sequences",
                                "Sequences in a replica's Continuous step loop now (each holds one of its max_seqs).",
                                labels=_FN)
    for r, f in rows:
        if f.sequences is not None:
            running.add_metric(_fn_labels(r, f), f.sequences)
    yield running
    yield _by_state(replicas)
    yield _start_phases(replicas)


def _fn_labels(replica: ReplicaStatus, stats: FunctionStats) -> list[str]:
    return [replica.app, stats.function, str(replica.version), replica.replica_id]


def _buckets(h: Histogram) -> list[tuple[str, float]]:
    cumulative, buckets = 0, []
    for bound, count in zip([*h.bounds, float("inf")], h.counts, strict=True):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(cumulative)))
    return buckets


def _by_state(replicas: list[ReplicaStatus]) -> GaugeMetricFamily:
    family = GaugeMetricFamily("ember_replicas", "Replicas reporting, by state.",
                               labels=["app", "service", "version", "state"])
    counts: Counter[tuple[str, ...]] = Counter((r.app, r.service, str(r.version), r.state) for r in replicas)
    for key in sorted({(r.app, r.service, str(r.version)) for r in replicas}):
        for state in STATES:
            family.add_metric([*key, state], counts[(*key, state)])
    return family


def _start_phases(replicas: list[ReplicaStatus]) -> GaugeMetricFamily:
    family = GaugeMetricFamily("ember_replica_start_seconds",
                               "Where each replica's start went, from the decision to start it (phase ready: all "
                               "together).", labels=["app", "service", "replica", "kind", "phase"])
    for r in replicas:
        if r.start is None:
            continue
        for phase in PHASES:
            value = getattr(r.start, phase)
            if value is not None:
                family.add_metric([r.app, r.service, r.replica_id, r.start.kind, phase.removesuffix("_s")], value)
    return family


def service_families(view: StatusView, in_flight: Mapping[tuple[str, str], int]) -> Iterator[Metric]:
    """The autoscaler's desired replicas against those ready, durable queues, and the gateway's calls in flight."""
    labels = ["app", "service"]
    desired = GaugeMetricFamily("ember_autoscaler_desired_replicas",
                                "Replicas the autoscaler wants for a service's current version.", labels=labels)
    ready = GaugeMetricFamily("ember_autoscaler_ready_replicas",
                              "Ready replicas of a service's current version.", labels=labels)
    bounds = GaugeMetricFamily("ember_autoscaler_bounds_replicas",
                               "A service's replica bounds (min_replicas, max_replicas).", labels=[*labels, "bound"])
    pending = GaugeMetricFamily("ember_queued_calls", "Calls waiting in a service's durable (spawn) queues.",
                                labels=labels)
    for s in view.services:
        desired.add_metric([s.app, s.service], s.desired)
        ready.add_metric([s.app, s.service], s.ready)
        bounds.add_metric([s.app, s.service, "min"], s.min_replicas)
        bounds.add_metric([s.app, s.service, "max"], s.max_replicas)
        pending.add_metric([s.app, s.service], s.pending)
    flying = GaugeMetricFamily("ember_requests_in_flight",
                               "Synchronous calls the gateway has sent and not yet answered.", labels=labels)
    for (app, service), count in sorted(in_flight.items()):
        flying.add_metric([app, service], count)
    yield from (desired, ready, bounds, pending, flying)


def fresh_replicas(replicas: Iterable[ReplicaStatus], now: float | None = None) -> list[ReplicaStatus]:
    """The replicas that reported within their time to live."""
    after = (time.time() if now is None else now) - REPLICA_TTL_S
    return sorted((r for r in replicas if r.updated_at > after), key=lambda r: (r.app, r.service, r.replica_id))


def all_families(view: StatusView, replicas: Iterable[ReplicaStatus], nodes: Mapping[str, NodeInfo],
                 in_flight: Mapping[tuple[str, str], int],
                 replaced: Mapping[tuple[str, str, str], int] | None = None) -> Iterator[Metric]:
    replicas = list(replicas)
    yield from replica_families(replicas)
    yield from service_families(view, in_flight)
    gave_way = CounterMetricFamily("ember_replicas_replaced", "Replicas that stopped taking calls on their own and "
                                   "were replaced, by why: health (their @ember.health check failed), stuck (a call "
                                   "ran past its timeout_s), other; counted by the control plane that acts.",
                                   labels=["app", "service", "reason"])
    for (app, service, why), count in sorted((replaced or {}).items()):
        gave_way.add_metric([app, service, why], count)
    yield gave_way
    yield from gpu.gpu_families(view, nodes, replicas)
