"""GET /v1/stats's figures: rates and quantiles from the differences of the call path's cumulative counters."""

from __future__ import annotations

import math

import pytest

from ember_platform.metrics.calls import LATENCY_BUCKETS, CallMetrics
from ember_platform.metrics.traffic import Totals, TrafficHistory, point, quantile

BOUNDS = (0.01, 0.1, 1.0, math.inf)


@pytest.mark.parametrize(("q", "cumulative", "expected"), [
    (0.5, (0, 10, 10, 10), 0.055),  # all in (0.01, 0.1]: the middle of the bucket
    (0.99, (0, 10, 10, 10), 0.0991),
    (0.5, (10, 10, 10, 10), 0.005),  # the first bucket starts at 0
    (0.5, (0, 0, 0, 4), 1.0),  # above every finite bound: the highest one
    (0.5, (0, 0, 0, 0), 0.0),  # nothing observed
])
def test_quantiles_are_read_as_histogram_quantile_reads_them(q: float, cumulative: tuple[float, ...],
                                                             expected: float) -> None:
    assert quantile(q, BOUNDS, cumulative) == pytest.approx(expected)


def test_a_point_is_the_difference_of_two_snapshots() -> None:
    before = Totals(calls=100, errors=10, bounds=BOUNDS, buckets=(100, 100, 100, 100))  # 100 fast calls earlier
    after = Totals(calls=120, errors=15, bounds=BOUNDS, buckets=(100, 120, 120, 120))  # then 20 slower ones
    p = point(t=12.0, seconds=2.0, before=before, after=after)
    assert (p.t, p.rate, p.error_rate) == (12.0, 10.0, 0.25)
    assert p.p50_s == pytest.approx(0.055)  # only the 20 calls of the interval count, not the 100 before


def test_the_history_counts_real_calls_and_hides_other_apps() -> None:
    metrics = CallMetrics()
    history = TrafficHistory(interval_s=1.0)
    history.update(100.0, metrics.totals)
    for _ in range(30):
        metrics.record("a", "f", 1, 200, 0.004)
    metrics.record("a", "f", 1, 500, 0.2)
    metrics.record("b", "g", 3, 200, 0.5)
    history.update(100.5, metrics.totals)  # too soon: no snapshot taken
    history.update(103.0, metrics.totals)
    view = history.view(103.0, sees=lambda app: app == "a")
    (fn,) = view.functions
    assert (fn.app, fn.function, fn.calls, fn.errors) == ("a", "f", 31, 1)
    (p,) = fn.points
    assert p.rate == pytest.approx(31 / 3.0)
    assert 0.003 <= p.p50_s <= 0.005 and p.p99_s > 0.005
    assert [f.app for f in history.view(103.0, sees=lambda app: True).functions] == ["a", "b"]


def test_the_history_is_bounded() -> None:
    metrics = CallMetrics()
    history = TrafficHistory(interval_s=1.0, keep=5)
    for i in range(20):
        metrics.record("a", "f", 1, 200, 0.01)
        history.update(float(i), metrics.totals)
    (fn,) = history.view(20.0, sees=lambda app: True).functions
    assert len(fn.points) == 4 and fn.calls == 20


def test_calls_of_no_function_are_counted_without_a_name() -> None:
    metrics = CallMetrics()
    metrics.record("", "", 0, 404, 0.001)
    assert metrics.totals() == {}  # not a function's traffic
    (sample,) = [s for f in metrics.registry().collect() for s in f.samples if s.name == "ember_requests_total"]
    assert sample.labels == {"app": "", "function": "", "version": "", "code": "404"} and sample.value == 1
    assert len(LATENCY_BUCKETS) < 30  # a bucket per observation costs a comparison on the call path
