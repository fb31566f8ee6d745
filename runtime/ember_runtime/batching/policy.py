"""When to dispatch a batch: a pure function of the queue, the clock and the cost model.

- A full batch (by count or by cost) goes at once.
- Otherwise wait for more calls only while it pays: the next call is expected (from the recent arrival
  rate) sooner than a batch's fixed cost, a call did arrive within the last fixed cost (arrivals come in
  bursts: closed-loop clients send their next call only once answered, so once a burst is over the window
  would be waited out for nothing), the batching window since the oldest waiting call is still open, the
  latency budget allows it, and waiting would not make the most urgent call miss its deadline. So an idle
  replica at low load never pays the window, and a busy one fills its batches.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember_runtime.batching.costmodel import CostModel


@dataclass(frozen=True)
class QueueView:
    count: int
    total_cost: float
    oldest_arrival: float  # monotonic seconds
    earliest_deadline: float  # monotonic seconds
    newest_arrival: float | None = None  # monotonic seconds; None: not known


@dataclass(frozen=True)
class Limits:
    max_size: int
    window_s: float
    max_cost: float | None = None
    latency_budget_s: float | None = None


def hold_for(view: QueueView, limits: Limits, model: CostModel, mean_gap_s: float, now: float) -> float:
    """Seconds to keep collecting before deciding again; 0 means dispatch now."""
    if view.count >= limits.max_size:
        return 0.0
    if limits.max_cost is not None and view.total_cost >= limits.max_cost:
        return 0.0
    if not model.fitted or mean_gap_s >= model.fixed_s:
        return 0.0  # the next call is not expected soon enough for waiting to pay
    close_at = view.oldest_arrival + limits.window_s
    if view.newest_arrival is not None:
        close_at = min(close_at, view.newest_arrival + model.fixed_s)
    next_cost = model.predict(view.count + 1)
    if limits.latency_budget_s is not None:
        close_at = min(close_at, view.oldest_arrival + limits.latency_budget_s - next_cost)
    close_at = min(close_at, view.earliest_deadline - next_cost)
    return max(0.0, close_at - now)
