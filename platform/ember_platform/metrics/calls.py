"""Counters and histograms on the gateway's call path.

Every call that names a deployed function is counted once it is answered: ``ember_requests_total`` by app,
function, version and HTTP status code, and its time at the gateway (request received to answer sent, including
the queue wait and run at the replica) in ``ember_request_duration_seconds``. Calls that name no deployed function
are counted under empty ``app`` and ``function`` labels, so that a caller cannot grow the label sets.

The label children are cached per (app, function, version, code): on the call path, counting is two dict lookups,
an increment and a histogram observation.

The series of a version are dropped once it no longer runs (it left ``Deployment.running``: replaced, or its app
deleted), when the gateway next counts a call or is scraped after the deployments changed (``follow``): else every
push would add a set for good, and ``GET /metrics`` and ``GET /v1/stats`` would grow without bound. What they had
counted is kept per function (``totals``), so that a function's calls in ``GET /v1/stats`` never go down, until no
running version has the function. A running version's counters are never reset.

Several processes: with ``PROMETHEUS_MULTIPROC_DIR`` set before the control plane starts (as ``prometheus_client``
requires), the counters live in files in that folder, shared by every process of the gateway, and
``registry()`` sums them (``prometheus_client.multiprocess``). ``prometheus_client`` cannot drop a series from its
files: there the series of versions gone are only left out of ``GET /metrics`` (``scrape``), and the files keep them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, multiprocess

from ember.wire import Deployment
from ember.wire.jetstream import KVMirror
from ember_platform.metrics.traffic import Key, Totals, TrafficHistory, plus, totals

# Seconds, fine enough at the low end that the console's p50 and p99 of fast calls mean something.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
LABELS = ("app", "function", "version", "code")
CALL_FAMILIES = frozenset({"ember_requests", "ember_request_duration_seconds"})
# app -> each version that runs -> its functions; None: not known yet (every series is kept)
Running = Mapping[str, Mapping[int, frozenset[str]]] | None
_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
disable_created_metrics()  # no ``_created`` series beside each counter and histogram: Prometheus does not need them


def multiprocess_dir() -> str:
    """The folder shared by the gateway's processes, or "" when each process counts alone."""
    return os.environ.get(_MULTIPROC_ENV, "")


def running_of(deployments: Iterable[Deployment]) -> dict[str, dict[int, frozenset[str]]]:
    """Each app's running versions and their functions."""
    return {dep.app: {v: frozenset(fn.name for svc in at.manifest.services for fn in svc.functions)
                      for v in dep.running() if (at := dep.release(v)) is not None}
            for dep in deployments}


def runs(running: Running, app: str, version: int | str) -> bool:
    """Whether the series of ``app``'s ``version`` are kept: the version runs, or the call named no deployed
    function (no app), or no version (0, or "" as a label)."""
    if running is None or not app:
        return True
    versions = running.get(app)
    return versions is not None and (not version or int(version) in versions)


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
        self.running: Running = None  # as of the deployments' ``generation`` last followed
        self._generation = -1
        self._retired: dict[Key, Totals] = {}  # what the dropped series of each function had counted
        self._lock = threading.Lock()  # ``totals`` (in a thread) sees a dropped series either live or retired

    def totals(self) -> dict[Key, Totals]:
        """Each function's cumulative calls, errors and latency buckets, now (those of its versions gone
        included)."""
        with self._lock:
            out = totals(self._own.collect())
            retired = dict(self._retired)
        for key, before in retired.items():
            out[key] = plus(before, out.get(key))
        return out

    def follow(self, deployments: KVMirror[Deployment]) -> None:
        """Drop the series of the versions that no longer run, if the deployments changed since the last call."""
        if deployments.generation != self._generation:
            self._generation = deployments.generation
            self.prune(running_of(list(deployments.items.values())))

    def prune(self, running: Running) -> None:
        """Keep the series of the versions ``running`` has (and of calls that named no deployed function), and
        what the others counted only in ``totals`` (while a running version has their function)."""
        self.running = running
        if running is None or multiprocess_dir():
            return  # the files keep every series: ``scrape`` leaves out those of versions gone
        gone: dict[tuple[str, str, int], tuple[dict[int, Counter], Histogram]] = {}
        for app, function, version, code in list(self._children):
            if not runs(running, app, version):
                counter, duration = self._children.pop((app, function, version, code))
                gone.setdefault((app, function, version), ({}, duration))[0][code] = counter
        with self._lock:
            for (app, function, version), (counters, duration) in gone.items():
                labels = (app, function, str(version) if version else "")
                key = (app, function)
                self._retired[key] = plus(self._retired.get(key), _counted(counters, duration))
                for code in counters:
                    self.requests.remove(*labels, str(code))
                self.duration.remove(*labels)
            self._retired = {key: t for key, t in self._retired.items()
                             if any(key[1] in fns for fns in running.get(key[0], {}).values())}

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


def _counted(counters: Mapping[int, Counter], duration: Histogram) -> Totals:
    """What one version of a function counted: its calls by code and its latency histogram."""
    calls = errors = 0
    for code, counter in counters.items():
        n = int(_value(counter.collect(), "ember_requests_total"))
        calls += n
        errors += n if code >= 400 else 0
    by_le = {float(s.labels["le"]): s.value for family in duration.collect() for s in family.samples
             if s.name == "ember_request_duration_seconds_bucket"}
    bounds = tuple(sorted(by_le))
    return Totals(calls, errors, bounds, tuple(by_le[b] for b in bounds))


def _value(families: Iterable[Any], name: str) -> float:
    return sum(s.value for family in families for s in family.samples if s.name == name)
