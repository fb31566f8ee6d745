"""Whether calls ran at the same time, from when each says it started and ended (its replica's clock, this
machine's): an ordering check, which a loaded machine slows down but cannot turn false."""

from __future__ import annotations

from collections.abc import Iterable


def most_at_once(spans: Iterable[tuple[float, float] | list[float]]) -> int:
    """The most ``(start, end)`` spans that were open at one instant (one ending as another starts: not together)."""
    edges = sorted(e for start, end in spans for e in ((start, 1), (end, -1)))  # an end sorts before a start
    open_now = most = 0
    for _, step in edges:
        open_now += step
        most = max(most, open_now)
    return most
