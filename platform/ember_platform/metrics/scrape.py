"""One scrape of ``GET /metrics``: the call path's counters and the control plane's state, for one reader.

A token that does not see every app gets only the samples of the apps it sees: every sample with an ``app`` label
is shown only to a reader who sees that app (as ``GET /v1/status`` shows replicas); the GPUs' figures, which have
none, are shown to every reader, as the status shows nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from ember_platform.control.status import build_status
from ember_platform.metrics import state
from ember_platform.platform import Platform

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class StateCollector:
    """The control plane's state (``state.all_families``), read at each scrape."""

    def __init__(self, platform: Platform, sees: Callable[[str], bool]) -> None:
        self.platform = platform
        self.sees = sees

    def collect(self) -> Iterator[Metric]:
        control = self.platform.control
        view = build_status(control)
        replicas = [r for r in state.fresh_replicas(self.platform.registry.replicas.items.values())
                    if self.sees(r.app)]
        yield from state.all_families(view, replicas, control.live_nodes(), dict(self.platform.router.in_flight),
                                      control.replaced)


class Visible:
    """Another collector's families, with only the samples of the apps ``sees`` accepts."""

    def __init__(self, source: CollectorRegistry | StateCollector, sees: Callable[[str], bool]) -> None:
        self.source = source
        self.sees = sees

    def collect(self) -> Iterable[Metric]:
        for family in self.source.collect():
            family.samples = [s for s in family.samples if "app" not in s.labels or self.sees(s.labels["app"])]
            yield family


class Once:
    """Several collectors' families, each name once: the first collector's that has it. With
    ``PROMETHEUS_MULTIPROC_DIR`` the call registry's multiprocess collector yields every family counted in the folder
    (the LLM and schedule families among them, summed over the processes), which their own registries would yield
    again: a family declared twice, which Prometheus's and OpenMetrics' parsers reject."""

    def __init__(self, *collectors: Visible) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        named: set[str] = set()
        for collector in self.collectors:
            for family in collector.collect():
                if family.name not in named:
                    named.add(family.name)
                    yield family


def render(platform: Platform, sees: Callable[[str], bool]) -> bytes:
    """The Prometheus text for a reader who sees the apps ``sees`` accepts."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Once(*(Visible(source, sees) for source in (
        platform.call_metrics.registry(), platform.llm_metrics.registry, platform.schedules.metrics.registry,
        StateCollector(platform, sees)))))
    return generate_latest(registry)
