"""``CallMetrics.prune``: the series of versions that no longer run go (all of an app's once it is not deployed),
a running version's counters go on, and ``totals`` still counts what the gone series had counted while a running
version has the function."""

from __future__ import annotations

from prometheus_client import generate_latest

from ember_platform.metrics.calls import CallMetrics


def series(metrics: CallMetrics) -> list[str]:
    return [line for line in generate_latest(metrics.registry()).decode().splitlines()
            if line and not line.startswith("#")]


def test_gone_versions_series_are_dropped_and_their_counts_kept_in_the_totals() -> None:
    metrics = CallMetrics()
    for version, code in ((1, 200), (1, 422), (2, 200), (2, 200)):
        metrics.record("a", "f", version, code, 0.002)
    metrics.record("", "", 0, 404, 0.001)  # named no deployed function
    metrics.record("b", "g", 1, 200, 0.001)
    metrics.prune({"a": {2: frozenset({"f"})}, "b": {1: frozenset({"g"})}})
    kept = series(metrics)
    assert not [line for line in kept if 'version="1"' in line and 'app="a"' in line]
    assert 'ember_requests_total{app="a",code="200",function="f",version="2"} 2.0' in kept
    assert 'ember_requests_total{app="",code="404",function="",version=""} 1.0' in kept
    assert len(kept) == 3 * 26  # a counter and 25 histogram series each for (a, f, 2), ("", "") and (b, g, 1)
    totals = metrics.totals()[("a", "f")]
    assert (totals.calls, totals.errors, totals.buckets[-1]) == (4, 1, 4)

    metrics.record("a", "f", 2, 200, 0.002)  # counted on: no reset
    assert 'ember_requests_total{app="a",code="200",function="f",version="2"} 3.0' in series(metrics)
    assert metrics.totals()[("a", "f")].calls == 5

    metrics.prune({"b": {1: frozenset({"g"})}})  # app a deleted
    assert not [line for line in series(metrics) if 'app="a"' in line]
    assert ("a", "f") not in metrics.totals()
    assert metrics.totals()[("b", "g")].calls == 1


def test_a_retired_functions_totals_go_once_no_running_version_has_it() -> None:
    metrics = CallMetrics()
    metrics.record("a", "old", 1, 200, 0.002)
    metrics.prune({"a": {2: frozenset({"new"})}})
    assert metrics.totals() == {}
