"""Counters and histograms on the gateway's call path.

Every call that names a deployed function is counted once it is answered: ``ember_requests_total`` by app,
function, version and HTTP status code, and its time at the gateway (request received to answer sent, including
the queue wait and run at the replica) in ``ember_request_duration_seconds``. Calls that name no deployed function
are counted under empty ``app`` and ``function`` labels, so that a caller cannot grow the label sets.

The label children are cached per (app, function, version, code): on the call path, counting is two dict lookups,
an increment and a histogram observation.

Several processes: with ``PROMETHEUS_MULTIPROC_DIR`` set before the control plane starts (as ``prometheus_client``
requires), the counters live in files in that folder, shared by every process of the gateway, and
``registry()`` sums them (``prometheus_client.multiprocess``).
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, multiprocess

from ember_platform.metrics.traffic import Key, Totals, TrafficHistory, totals

# Seconds, fine enough at the low end that the console's p50 and p99 of fast calls mean something.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
LABELS = ("app", "function", "version", "code")
_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
disable_created_metrics()  # no ``_created`` series beside each counter and histogram: Prometheus does not need them


def multiprocess_dir() -> str:
    """The folder shared by the gateway's processes, or "" when each process counts alone."""
    return os.environ.get(_MULTIPROC_ENV, "")


class CallMetrics:
    """The call path's counters, in a registry of their own (or in the multiprocess folder's files)."""

    def __init__(self) -> None:
        self._own = CollectorRegistry(auto_describe=True)
        shared = bool(multiprocess_dir())
        owner = None if shared else self._own  # in multiprocess mode the files are the registry
        self.requests = Counter("ember_requests", "Calls answered by the gateway, by status code.", LABELS,
                                registry=owner)
        self.duration = Histogram("ember_request_duration_seconds",
                                  "Time of a call at the gateway, from its request to its answer.", LABELS[:3],
                                  buckets=LATENCY_BUCKETS, registry=owner)
        self._children: dict[tuple[str, str, int, int], tuple[Counter, Histogram]] = {}
        if shared:
            multiprocess.MultiProcessCollector(self._own)
        self.history = TrafficHistory()  # GET /v1/stats

    def totals(self) -> dict[Key, Totals]:
        """Each function's cumulative calls, errors and latency buckets, now."""
        return totals(self._own.collect())

    def registry(self) -> CollectorRegistry:
        """Where these metrics are collected from (all the processes' in multiprocess mode)."""
        return self._own

    def record(self, app: str, function: str, version: int, code: int, seconds: float) -> None:
        """One answered call."""
        key = (app, function, version, code)
        children = self._children.get(key)
        if children is None:
            labels = (app, function, str(version) if version else "")
            children = self._children[key] = (self.requests.labels(*labels, str(code)), self.duration.labels(*labels))
        children[0].inc()
        children[1].observe(seconds)
