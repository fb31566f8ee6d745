"""The dispatch decision and the cost model: pure functions, driven with a fake clock."""

from __future__ import annotations

import math

import pytest

from ember_runtime.batching.costmodel import CostModel
from ember_runtime.batching.policy import Limits, QueueView, hold_for

LIMITS = Limits(max_size=8, window_s=0.010)
EAGER = CostModel(a=0.004, b=0.001)  # 4 ms fixed per batch, 1 ms per item


def view(count: int = 1, *, oldest: float = 100.0, deadline: float = math.inf, cost: float | None = None):
    return QueueView(count=count, total_cost=float(count if cost is None else cost), oldest_arrival=oldest,
                     earliest_deadline=deadline)


def test_a_full_batch_goes_now():
    assert hold_for(view(8), LIMITS, EAGER, mean_gap_s=0.0001, now=100.0) == 0


def test_a_batch_at_its_cost_limit_goes_now():
    limits = Limits(max_size=8, window_s=0.010, max_cost=100)
    assert hold_for(view(2, cost=100), limits, EAGER, mean_gap_s=0.0001, now=100.0) == 0


def test_without_a_cost_estimate_the_batcher_does_not_wait():
    assert hold_for(view(1), LIMITS, CostModel(), mean_gap_s=0.0001, now=100.0) == 0


def test_it_waits_only_when_the_next_call_is_due_before_a_batch_fixed_cost():
    assert hold_for(view(1), LIMITS, EAGER, mean_gap_s=0.010, now=100.0) == 0  # sparse arrivals
    assert hold_for(view(1), LIMITS, EAGER, mean_gap_s=0.001, now=100.0) == pytest.approx(0.010)


def test_the_window_counts_from_the_oldest_call():
    assert hold_for(view(3, oldest=100.0), LIMITS, EAGER, mean_gap_s=0.001, now=100.006) == pytest.approx(0.004)
    assert hold_for(view(3, oldest=100.0), LIMITS, EAGER, mean_gap_s=0.001, now=100.020) == 0


def test_it_stops_waiting_once_a_burst_of_arrivals_is_over():
    # 4 ms fixed cost: a call that arrived 1 ms ago keeps the batch open 3 ms more, within the 10 ms window;
    # with none for 5 ms the burst is over and the batch goes, although the window is still open.
    burst = QueueView(count=3, total_cost=3.0, oldest_arrival=100.0, earliest_deadline=math.inf,
                      newest_arrival=100.002)
    assert hold_for(burst, LIMITS, EAGER, mean_gap_s=0.001, now=100.003) == pytest.approx(0.003)
    assert hold_for(burst, LIMITS, EAGER, mean_gap_s=0.001, now=100.007) == 0


def test_the_latency_budget_includes_the_predicted_run_time():
    limits = Limits(max_size=8, window_s=0.050, latency_budget_s=0.012)
    # budget 12 ms - predicted 4 + 2·1 = 6 ms -> close 6 ms after the oldest call
    assert hold_for(view(1), limits, EAGER, mean_gap_s=0.001, now=100.0) == pytest.approx(0.006)


def test_waiting_never_makes_the_most_urgent_call_late():
    # deadline in 9 ms, a batch of 2 takes 6 ms: at most 3 ms of waiting
    assert hold_for(view(1, deadline=100.009), LIMITS, EAGER, mean_gap_s=0.001, now=100.0) == pytest.approx(0.003)
    assert hold_for(view(1, deadline=100.005), LIMITS, EAGER, mean_gap_s=0.001, now=100.0) == 0


def test_the_cost_model_recovers_a_line():
    model = CostModel()
    for n in (1, 2, 4, 8, 16, 32, 4, 8):
        model.observe(n, 0.003 + 0.0005 * n)
    assert model.fixed_s == pytest.approx(0.003)
    assert model.predict(10) == pytest.approx(0.008)


def test_the_cost_model_needs_a_few_samples_and_splits_a_single_size():
    model = CostModel()
    for _ in range(3):
        model.observe(4, 0.008)
        assert not model.fitted or model.predict(4) > 0
    model.observe(4, 0.008)
    assert model.fitted
    assert model.predict(4) == pytest.approx(0.008)
    assert model.fixed_s == pytest.approx(0.004)


def test_the_cost_model_never_predicts_negative_costs():
    model = CostModel()
    for n, t in ((1, 0.010), (2, 0.009), (4, 0.007), (8, 0.002)):
        model.observe(n, t)
    assert model.predict(1) >= 0 and model.predict(64) >= 0 and model.fixed_s >= 0
