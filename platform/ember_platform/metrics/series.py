"""The series of a prometheus_client family, read and removed by their label values: how the platform's figures
forget what no longer runs (a deleted app's, a renamed model's) instead of keeping every series they ever had."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from prometheus_client.metrics import MetricWrapperBase


def of(family: MetricWrapperBase, names: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], float]]:
    """Each series of ``family`` (its labels ``names``): its label values, and its first sample's value."""
    seen: set[tuple[str, ...]] = set()
    for metric in family.collect():
        for sample in metric.samples:
            labels = tuple(sample.labels.get(name, "") for name in names)
            if labels not in seen:
                seen.add(labels)
                yield labels, sample.value


def remove(families: Iterable[MetricWrapperBase], gone: set[tuple[str, ...]]) -> None:
    """The series of ``gone`` out of each of ``families`` (where it has them)."""
    for family in families:
        for labels in gone:
            with contextlib.suppress(KeyError):
                family.remove(*labels)
