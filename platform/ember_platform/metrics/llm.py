"""Language models' figures on the gateway, under the names vLLM's users know: time to first token, inter-token
latency, prompt and generation tokens (``rate(vllm:generation_tokens_total[1m])`` is tokens/s), and the requests
running now, by ``model_name`` (and ``app``, which decides who sees them: see ``scrape``). A model no deployed version
serves any more (its app deleted, the model renamed) loses its series once none of its requests runs (``follow``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ember.wire import Deployment
from ember_platform.metrics import series
from ember_platform.metrics.calls import LATENCY_BUCKETS

LABELS = ("model_name", "app")


class LlmMetrics:
    """The OpenAI-compatible routes' counters, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time from a request to its first piece.", LABELS,
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between two pieces of one answer.", LABELS,
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.generated = Counter("vllm:generation_tokens", "Pieces generated (one per item or step).", LABELS,
                                 registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "Requests being answered now.", LABELS,
                             registry=self.registry)
        self._generation = -1  # the deployments' generation ``follow`` last pruned for
        self._left: set[tuple[str, ...]] = set()  # series kept then for their running requests

    def follow(self, generation: int, served: Callable[[], set[tuple[str, str]]]) -> None:
        """Drop the series of the (model, app) pairs ``served`` no longer has, but those whose requests still run
        (dropped at a later call, once they ended); only when the deployments changed (``generation``) or such
        series were left."""
        if generation == self._generation and not self._left:
            return
        keep = served()
        self._generation = generation
        running = {labels for labels, value in series.of(self.running, LABELS) if value > 0}
        families = (self.ttft, self.itl, self.generated, self.running)
        gone = {labels for family in families for labels, _ in series.of(family, LABELS)} - keep
        self._left = gone & running
        series.remove(families, gone - running)


def served_models(deployments: Mapping[str, Deployment]) -> set[tuple[str, str]]:
    """(model, app) of every model a version taking calls serves (``openai=``)."""
    return {(fn.openai, app) for app, dep in deployments.items() for share in dep.serving()
            if (at := dep.at(share.version)) is not None
            for svc in at.manifest.services for fn in svc.functions if fn.openai}


class LlmTimer:
    """One request's figures: ``first`` at its first piece, ``piece`` at each, ``done`` once (however it ends)."""

    def __init__(self, metrics: LlmMetrics, model: str, app: str) -> None:
        self._labels = (model, app)
        self._metrics = metrics
        self._started = self._last = time.perf_counter()
        self._ended = False
        self._itl = metrics.itl.labels(*self._labels)  # looked up once: it is observed at every piece
        self._generated = metrics.generated.labels(*self._labels)  # counted as each piece comes, not at the end
        metrics.running.labels(*self._labels).inc()

    def first(self) -> None:
        self._metrics.ttft.labels(*self._labels).observe(time.perf_counter() - self._started)

    def piece(self) -> None:
        self._generated.inc()  # a long stream's tokens show in rate() while it runs
        now = time.perf_counter()
        if self._last != self._started:
            self._itl.observe(now - self._last)
        self._last = now

    def done(self) -> None:
        if not self._ended:
            self._ended = True
            self._metrics.running.labels(*self._labels).dec()
