"""The autoscaler on generated traces: no flapping, steps reached quickly, bounds always respected."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember_platform.scheduler import AutoscaleConfig, AutoscaleState, Signals, desired_replicas, initial_state
from ember_platform.scheduler.autoscale import in_flight_target

TICK_S = 1.0
THROUGHPUT = 10.0  # calls/s one replica serves


def run(config: AutoscaleConfig, rates: list[float], *, startup_s: float = 5.0,
        extra: Callable[[int], dict[str, Any]] | None = None) -> list[int]:
    """Feeds a trace of arrival rates tick by tick; the signals follow the count decided."""
    state = initial_state(config)
    counts = []
    for tick, rate in enumerate(rates):
        current = state.desired
        in_flight = min(rate / THROUGHPUT, current) * 1.0
        signals = Signals(now=tick * TICK_S, ready=current, arrival_rate=rate, in_flight=round(in_flight),
                          throughput_per_replica=THROUGHPUT, startup_s=startup_s, **(extra(tick) if extra else {}))
        count, state = desired_replicas(signals, config, state)
        counts.append(count)
    return counts


def noisy(level: float, ticks: int, noise: float, seed: int = 7) -> list[float]:
    rng = random.Random(seed)
    return [max(0.0, level * (1 + rng.uniform(-noise, noise))) for _ in range(ticks)]


def changes(counts: list[int]) -> Iterator[int]:
    return (b - a for a, b in itertools.pairwise(counts) if b != a)


def test_a_noisy_steady_load_does_not_flap() -> None:
    counts = run(AutoscaleConfig(max_replicas=100, scaledown_window_s=60), noisy(100.0, 1200, 0.25))
    settled = counts[60:]
    assert len(list(changes(settled))) <= 2, sorted(set(settled))
    assert min(settled) >= 100 / (THROUGHPUT * 0.8)  # enough replicas for the mean load


def test_a_load_step_up_is_reached_within_two_ticks() -> None:
    counts = run(AutoscaleConfig(max_replicas=100), [10.0] * 30 + [200.0] * 30)
    needed = 200 / (THROUGHPUT * 0.8)
    assert next(i for i, c in enumerate(counts) if c >= needed) - 30 <= 1


def test_a_step_down_waits_for_the_window_then_follows() -> None:
    counts = run(AutoscaleConfig(max_replicas=100, scaledown_window_s=30), [200.0] * 30 + [20.0] * 100)
    assert counts[29] == counts[58] == 25  # still holding inside the window
    assert counts[-1] == 3
    assert len(list(changes(counts[30:]))) == 1


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 5), st.integers(0, 20), st.integers(0, 3),
       st.lists(st.floats(0, 1000, allow_nan=False), min_size=1, max_size=80))
def test_min_and_max_are_respected_on_any_trace(low: int, span: int, buffer: int, rates: list[float]) -> None:
    config = AutoscaleConfig(min_replicas=low, max_replicas=max(low + span, 1), buffer_replicas=buffer,
                             scaledown_window_s=5)
    assert all(config.min_replicas <= c <= config.max_replicas for c in run(config, rates))


def test_never_below_the_replicas_still_starting() -> None:
    config = AutoscaleConfig(max_replicas=10, scaledown_window_s=0)
    state = AutoscaleState(desired=6)
    count, _ = desired_replicas(Signals(now=1.0, ready=2, starting=4), config, state)
    assert count == 4


def test_scale_from_zero_on_the_first_call_and_back_to_zero_when_idle() -> None:
    config = AutoscaleConfig(min_replicas=0, max_replicas=4, scaledown_window_s=10)
    count, state = desired_replicas(Signals(now=0.0, queue_depth=1), config, initial_state(config))
    assert count == 1
    for t in range(1, 12):
        count, state = desired_replicas(Signals(now=float(t), ready=1), config, state)
    assert count == 0


def test_an_idle_function_at_rest_keeps_its_state() -> None:
    config = AutoscaleConfig(min_replicas=1, max_replicas=4, scaledown_window_s=5)
    count, state = desired_replicas(Signals(now=0.0, arrival_rate=50.0, throughput_per_replica=10), config,
                                    initial_state(config))
    for t in range(1, 400):
        count, state = desired_replicas(Signals(now=float(t), ready=count), config, state)
    assert (count, state.rate, state.trend, state.below_since) == (1, 0.0, 0.0, None)
    again, same = desired_replicas(Signals(now=500.0, ready=1), config, state)
    assert (again, same) == (1, state)
    woken, _ = desired_replicas(Signals(now=501.0, ready=1, arrival_rate=35.0, throughput_per_replica=10), config,
                                state)
    assert woken == config.max_replicas  # 35 calls/s at 8 per replica: 5 wanted, capped at 4


def test_min_replicas_are_kept_without_load() -> None:
    counts = run(AutoscaleConfig(min_replicas=2, max_replicas=10, scaledown_window_s=0), [0.0] * 20)
    assert counts == [2] * 20


def test_buffer_replicas_are_kept_under_load_only() -> None:
    config = AutoscaleConfig(max_replicas=20, buffer_replicas=2, scaledown_window_s=0)
    assert run(config, [40.0] * 3)[-1] == 5 + 2
    assert run(config, [0.0] * 3)[-1] == 0


def test_the_durable_backlog_is_drained_in_time() -> None:
    config = AutoscaleConfig(max_replicas=50, drain_s=30)
    count, _ = desired_replicas(Signals(now=0.0, durable_pending=3000, throughput_per_replica=THROUGHPUT,
                                        startup_s=10.0), config, initial_state(config))
    assert count == 8  # 3000 calls / (10 calls/s x (10 s start-up + 30 s)) = 7.5


def test_a_rising_load_is_met_ahead_by_the_startup_time() -> None:
    ramp = [10.0 + 5 * t for t in range(40)]
    slow = run(AutoscaleConfig(max_replicas=100), ramp, startup_s=30.0)
    fast = run(AutoscaleConfig(max_replicas=100), ramp, startup_s=0.0)
    assert slow[-1] > fast[-1]


def test_a_slower_starting_function_gets_more_headroom_in_proportion() -> None:
    """On a ramp of 5 calls/s per s, a replica taking ``startup_s`` to start is asked for that much earlier:
    up to 5 x startup_s calls/s more, i.e. 5 x startup_s / (10 x 0.8) replicas, once the trend is measured
    (over ``startup_s``: after two of them, most of it)."""
    ramp = [10.0 + 5 * t for t in range(130)]
    counts = {startup: run(AutoscaleConfig(max_replicas=500), ramp, startup_s=startup) for startup in (0, 16, 64)}
    assert all(a <= b <= c for a, b, c in zip(counts[0], counts[16], counts[64], strict=True))
    for startup in (16, 64):
        headroom = counts[startup][-1] - counts[0][-1]
        ideal = 5 * startup / (THROUGHPUT * 0.8)
        assert 0.75 * ideal <= headroom <= ideal + 1, (startup, headroom, ideal)


def test_a_slow_start_does_not_make_a_noisy_steady_load_flap() -> None:
    counts = run(AutoscaleConfig(max_replicas=100, scaledown_window_s=60), noisy(100.0, 1200, 0.25),
                 startup_s=60.0)
    assert len(list(changes(counts[60:]))) <= 2, sorted(set(counts[60:]))


def test_a_load_step_is_reached_within_two_ticks_however_slow_the_start() -> None:
    for startup in (0.0, 60.0):
        counts = run(AutoscaleConfig(max_replicas=100), noisy(10.0, 30, 0.1) + noisy(200.0, 30, 0.1),
                     startup_s=startup)
        assert next(i for i, c in enumerate(counts) if c >= 200 * 0.9 / (THROUGHPUT * 0.8)) - 30 <= 1


def test_p95_over_target_adds_a_replica_per_tick_while_calls_queue() -> None:
    config = AutoscaleConfig(max_replicas=10, target_p95_ms=100)
    state = AutoscaleState(desired=2)
    for expected in (3, 4, 5):
        count, state = desired_replicas(Signals(now=float(expected), ready=2, p95_ms=400, queue_depth=1), config,
                                        state)
        assert count == expected
    count, _ = desired_replicas(Signals(now=9.0, ready=5, p95_ms=400, queue_depth=0), config, state)
    assert count == 5


def test_p95_under_target_or_without_one_adds_nothing() -> None:
    state = AutoscaleState(desired=2)
    for config, p95 in ((AutoscaleConfig(max_replicas=10, target_p95_ms=500), 400.0),
                        (AutoscaleConfig(max_replicas=10), 4000.0)):
        count, _ = desired_replicas(Signals(now=1.0, ready=2, p95_ms=p95, queue_depth=1), config, state)
        assert count == 2


def test_an_arrival_rate_above_what_replicas_run_scales_past_the_current_capacity() -> None:
    """2 replicas run 20 calls/s (their throughput) while the gateway receives 40: 40 / (10 * 0.8) = 5."""
    config = AutoscaleConfig(max_replicas=10)
    count, _ = desired_replicas(Signals(now=0.0, ready=2, in_flight=2, arrival_rate=40.0,
                                        throughput_per_replica=THROUGHPUT), config, AutoscaleState(desired=2))
    assert count == 5


def test_a_service_s_latency_target_reaches_its_autoscaler() -> None:
    from support.builders import deployment

    from ember.wire import FunctionSpec, ServiceSpec
    from ember_platform.control.loop import _config

    fn = FunctionSpec(name="f", attr="f", input_mode="kwargs", params=[], input_schema={}, output_schema={})
    svc = ServiceSpec(name="f", kind="function", functions=[fn], max_replicas=4, target_p95_ms=250.0)
    dep = deployment(svc)
    assert _config(dep, svc).target_p95_ms == 250.0
    assert _config(dep, msgspec.structs.replace(svc, target_p95_ms=None)).target_p95_ms is None


def test_without_a_throughput_measurement_concurrency_decides() -> None:
    config = AutoscaleConfig(max_replicas=10, target_in_flight=2)
    count, _ = desired_replicas(Signals(now=0.0, in_flight=6, queue_depth=3), config, initial_state(config))
    assert count == 5


def test_lowering_max_takes_effect_at_once() -> None:
    count, _ = desired_replicas(Signals(now=0.0, ready=8, in_flight=16), AutoscaleConfig(max_replicas=3),
                                AutoscaleState(desired=8))
    assert count == 3


@pytest.mark.parametrize(("fields", "message"), [
    ({"min_replicas": 3, "max_replicas": 2}, "need 0 <= min_replicas <= max_replicas"),
    ({"max_replicas": 0}, "max_replicas must be >= 1"),
    ({"buffer_replicas": -1}, "buffer_replicas must be >= 0"),
    ({"target_utilization": 0}, "target_utilization is a share"),
    ({"target_in_flight": 0}, "target_in_flight must be > 0"),
    ({"target_p95_ms": 0}, "target_p95_ms must be > 0 or None"),
    ({"target_p95_ms": -5.0}, "target_p95_ms must be > 0 or None"),
])
def test_bad_configs_are_refused(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ember.InvalidSpecError, match=message):
        AutoscaleConfig(**fields)  # type: ignore[arg-type]


def test_a_service_first_seen_keeps_what_runs_within_its_bounds() -> None:
    # A control plane that restarted or took over must not cut a busy service back to min_replicas.
    config = AutoscaleConfig(min_replicas=1, max_replicas=4)
    assert initial_state(config).desired == 1  # a new service
    assert initial_state(config, running=3).desired == 3
    assert initial_state(config, running=9).desired == 4
    assert initial_state(AutoscaleConfig(min_replicas=2, max_replicas=4), running=0).desired == 2


def test_running_sequences_count_against_max_seqs():
    """A Continuous step's sequences are its calls in flight (max_concurrency is its max_seqs): a replica takes
    80 % of its max_seqs before another is asked for, whatever their pace (a stream's rate says nothing of them)."""
    config = AutoscaleConfig(min_replicas=1, max_replicas=4, target_in_flight=in_flight_target(32))
    for running, replicas in ((25, 1), (26, 2), (51, 2), (52, 3)):
        signals = Signals(now=0.0, ready=1, in_flight=running, arrival_rate=0.1, throughput_per_replica=50.0)
        assert desired_replicas(signals, config, initial_state(config))[0] == replicas, running
