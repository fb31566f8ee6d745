"""Recent traffic per function, from the call path's own counters (``CallMetrics``), for ``GET /v1/stats``.

The history is a ring of snapshots of the cumulative counters, taken at most every ``interval_s`` when someone
asks (nothing runs in the background, and nothing is added to the call path): between two snapshots, the rate is
the difference of the counts over the time, and p50 and p99 are read from the difference of the latency
histograms' buckets the way PromQL's ``histogram_quantile`` reads them (linear within a bucket).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

from ember.wire.stats import FunctionTraffic, StatsView, TrafficPoint

Key = tuple[str, str]  # (app, function)


@dataclass(frozen=True)
class Totals:
    """One function's cumulative figures: calls, errors, and calls per latency bucket (cumulative, le order)."""

    calls: int
    errors: int
    bounds: tuple[float, ...]
    buckets: tuple[float, ...]


def totals(families: Iterable[Metric]) -> dict[Key, Totals]:
    """Each function's totals from the families of ``CallMetrics.registry().collect()`` (versions summed)."""
    calls: dict[Key, float] = {}
    errors: dict[Key, float] = {}
    buckets: dict[Key, dict[float, float]] = {}
    for family in families:
        for s in family.samples:
            key = (s.labels.get("app", ""), s.labels.get("function", ""))
            if not key[0]:
                continue
            if s.name == "ember_requests_total":
                calls[key] = calls.get(key, 0) + s.value
                if int(s.labels.get("code", "0")) >= 400:
                    errors[key] = errors.get(key, 0) + s.value
            elif s.name == "ember_request_duration_seconds_bucket":
                le = float(s.labels["le"])
                into = buckets.setdefault(key, {})
                into[le] = into.get(le, 0) + s.value
    out = {}
    for key, count in calls.items():
        by_le = buckets.get(key, {})
        bounds = tuple(sorted(by_le))
        out[key] = Totals(int(count), int(errors.get(key, 0)), bounds, tuple(by_le[b] for b in bounds))
    return out


def plus(a: Totals | None, b: Totals | None) -> Totals:
    """The sum of two totals of one function (``a`` or ``b`` alone when the other is None)."""
    if a is None or b is None:
        out = a or b
        assert out is not None
        return out
    if a.bounds == b.bounds:
        buckets = tuple(x + y for x, y in zip(a.buckets, b.buckets, strict=True))
        return Totals(a.calls + b.calls, a.errors + b.errors, a.bounds, buckets)
    wider = a if len(a.bounds) >= len(b.bounds) else b  # one has no histogram yet: the other's buckets
    return Totals(a.calls + b.calls, a.errors + b.errors, wider.bounds, wider.buckets)


def quantile(q: float, bounds: tuple[float, ...], cumulative: tuple[float, ...]) -> float:
    """The ``q`` quantile of the observations counted in cumulative buckets (upper ``bounds``, the last +Inf)."""
    if not cumulative or cumulative[-1] <= 0:
        return 0.0
    rank = q * cumulative[-1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(bounds, cumulative, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # above every finite bucket: its lower edge, as histogram_quantile answers
            width = count - lower_count
            return lower_bound + (bound - lower_bound) * ((rank - lower_count) / width if width else 1.0)
        lower_bound, lower_count = bound, count
    return lower_bound


def point(t: float, seconds: float, before: Totals | None, after: Totals) -> TrafficPoint:
    """The interval of ``seconds`` ending at ``t`` between two snapshots of one function."""
    calls = after.calls - (before.calls if before else 0)
    errors = after.errors - (before.errors if before else 0)
    if before is not None and before.bounds == after.bounds:
        delta = tuple(a - b for a, b in zip(after.buckets, before.buckets, strict=True))
    else:
        delta = after.buckets
    return TrafficPoint(t=t, rate=calls / seconds if seconds > 0 else 0.0, error_rate=errors / calls if calls else 0.0,
                        p50_s=quantile(0.5, after.bounds, delta), p99_s=quantile(0.99, after.bounds, delta))


class TrafficHistory:
    """The last ``keep`` snapshots, at least ``interval_s`` apart."""

    def __init__(self, interval_s: float = 2.0, keep: int = 150) -> None:
        self.interval_s = interval_s
        self._snapshots: deque[tuple[float, dict[Key, Totals]]] = deque(maxlen=keep)
        self._taking = threading.Lock()  # ``update`` runs in a thread: two requests at once take one snapshot

    def update(self, now: float, snapshot: Callable[[], Mapping[Key, Totals]]) -> None:
        """Take a snapshot if the last one is ``interval_s`` old (``snapshot`` is called only then)."""
        with self._taking:
            if not self._snapshots or now - self._snapshots[-1][0] >= self.interval_s:
                self._snapshots.append((now, dict(snapshot())))

    def view(self, now: float, sees: Callable[[str], bool]) -> StatsView:
        """Per function of the apps ``sees`` accepts: its totals and one point per interval between snapshots."""
        shots = list(self._snapshots)
        keys = sorted({k for _, snap in shots for k in snap if sees(k[0])})
        functions = []
        for key in keys:
            points = [point(t, t - t0, s0.get(key), s1[key])
                      for (t0, s0), (t, s1) in itertools.pairwise(shots) if key in s1]
            last = next(snap[key] for _, snap in reversed(shots) if key in snap)
            functions.append(FunctionTraffic(app=key[0], function=key[1], calls=last.calls, errors=last.errors,
                                             points=points))
        return StatsView(now=now, interval_s=self.interval_s, functions=functions)
