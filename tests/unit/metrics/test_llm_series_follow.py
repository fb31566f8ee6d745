"""The language-model figures forget a model no deployed version serves, but not while one of its requests runs
(its running gauge would go below zero when the request ends)."""

from __future__ import annotations

from ember_platform.metrics import series
from ember_platform.metrics.llm import LABELS, LlmMetrics, LlmTimer


def _models(metrics: LlmMetrics) -> set[tuple[str, ...]]:
    return {labels for family in (metrics.ttft, metrics.generated, metrics.running)
            for labels, _ in series.of(family, LABELS)}


def test_a_model_no_longer_served_loses_its_series_once_its_requests_end() -> None:
    metrics = LlmMetrics()
    done, running = LlmTimer(metrics, "old", "a"), LlmTimer(metrics, "busy", "b")
    for timer in (done, running):
        timer.first()
        timer.piece()
    done.done()
    LlmTimer(metrics, "kept", "c").done()
    metrics.follow(1, lambda: {("kept", "c")})
    assert _models(metrics) == {("busy", "b"), ("kept", "c")}  # "busy" runs still
    running.done()
    metrics.follow(1, lambda: {("kept", "c")})  # the same deployments: what was left is looked at again
    assert _models(metrics) == {("kept", "c")}
    assert dict(series.of(metrics.running, LABELS)) == {("kept", "c"): 0.0}
    calls = []
    metrics.follow(1, lambda: calls.append(1) or set())
    assert calls == []  # nothing changed, nothing left: not even the served models are asked for
