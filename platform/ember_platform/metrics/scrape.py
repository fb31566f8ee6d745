"""One scrape of ``GET /metrics``: the call path's counters and the control plane's state, for one reader.

A token that does not see every app gets only the samples of the apps it sees: every sample with an ``app`` label
is shown only to a reader who sees that app (as ``GET /v1/status`` shows replicas); the GPUs' figures, which have
none, are shown to every reader, as the status shows nodes.

The call path's series are shown for the versions that run and for calls that named no deployed function
(``calls.runs``): those of a version gone are dropped from the counters once the gateway sees the change
(``CallMetrics.follow``), and left out of the text at once (in multiprocess mode, where ``prometheus_client``
cannot drop them from its files, only left out).

The state is read on the event loop (``state_families``) and the rest may be rendered in a thread (``text``): the
counters can be many (apps times functions times versions times codes, 26 series each), and ``prometheus_client``
collects them under its own locks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from ember_platform.control.status import build_status
from ember_platform.metrics import state
from ember_platform.metrics.calls import CALL_FAMILIES, Running, runs
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


class Families:
    """Families read already (the state, read on the event loop), as a collector."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


class Visible:
    """Another collector's families, with only the samples of the apps ``sees`` accepts and, of the call path's,
    of the versions ``running`` has."""

    def __init__(self, source: CollectorRegistry | StateCollector | Families, sees: Callable[[str], bool],
                 running: Running = None) -> None:
        self.source = source
        self.sees = sees
        self.running = running

    def collect(self) -> Iterable[Metric]:
        for family in self.source.collect():
            by_version = family.name in CALL_FAMILIES
            family.samples = [s for s in family.samples if self._shown(s.labels, by_version)]
            yield family

    def _shown(self, labels: dict[str, str], by_version: bool) -> bool:
        app = labels.get("app")
        if app is None:
            return True
        return self.sees(app) and (not by_version or runs(self.running, app, labels.get("version", "")))


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


def state_families(platform: Platform, sees: Callable[[str], bool]) -> Families:
    """The control plane's state for a reader who sees the apps ``sees`` accepts, read now."""
    return Families(StateCollector(platform, sees).collect())


def text(platform: Platform, state_now: Families, sees: Callable[[str], bool], running: Running) -> bytes:
    """The Prometheus text of the counters and ``state_now`` for a reader who sees the apps ``sees`` accepts, with
    the call path's series of the versions ``running`` has. Safe in another thread: besides its arguments it reads
    only ``prometheus_client``'s registries."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Once(*(Visible(source, sees, running) for source in (
        platform.call_metrics.registry(), platform.llm_metrics.registry, platform.schedules.metrics.registry,
        state_now))))
    return generate_latest(registry)


def render(platform: Platform, sees: Callable[[str], bool]) -> bytes:
    """The Prometheus text for a reader who sees the apps ``sees`` accepts, all at once."""
    return text(platform, state_families(platform, sees), sees, platform.call_metrics.running)
