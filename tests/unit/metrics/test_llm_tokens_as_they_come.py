"""``vllm:generation_tokens_total`` counts each piece as it goes out: a stream of fifteen minutes shows in
``rate(...[1m])`` while it runs, not all at once at its end."""

from __future__ import annotations

from ember_platform.metrics import series
from ember_platform.metrics.llm import LlmMetrics, LlmTimer


def test_the_tokens_of_a_stream_still_running_are_counted() -> None:
    metrics = LlmMetrics()
    timer = LlmTimer(metrics, "tiny-gpt", "chat")
    timer.first()
    for _ in range(3):
        timer.piece()
    assert dict(series.of(metrics.generated, ("model_name", "app"))) == {("tiny-gpt", "chat"): 3.0}
    timer.done()
    assert dict(series.of(metrics.generated, ("model_name", "app"))) == {("tiny-gpt", "chat"): 3.0}
