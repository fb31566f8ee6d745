"""Load measured from replicas' reports and the gateway: arrival rates, throughput, start-up time, p95 latency."""

from __future__ import annotations

import math

from ember.wire import FunctionStats, Histogram, ReplicaStatus, StartPhases
from ember_platform.scheduler import AutoscaleConfig, Meter, Signals, desired_replicas, initial_state, measure

REPORT_S = 2.0  # replicas report this often (their heartbeat); the control loop ticks faster
TICK_S = 0.5


def histogram(total: float, count: int) -> Histogram:
    return Histogram(bounds=[], counts=[count], sum=total, count=count)


def status(replica_id: str, at: float, calls: int, *, busy_s: float = 0.0, ready_s: float | None = None,
           queued: int = 0, in_flight: int = 0, state: str = "ready") -> ReplicaStatus:
    """A replica's report at ``at``: ``calls`` run so far in batches of one, taking ``busy_s`` in all."""
    stats = FunctionStats(function="f", calls=calls, batches=calls, expired=0, rejected=0, cancelled=0, failed=0,
                          queue_depth=queued, fill_ratio=1.0, batch_size=histogram(calls, calls),
                          queue_wait_s=histogram(0.0, calls), run_s=histogram(busy_s, calls), in_flight=in_flight)
    start = None if ready_s is None else StartPhases(kind="cold", fetch_s=0.0, interpreter_s=0.0, imports_s=0.0,
                                                     setup_s=ready_s, ready_s=ready_s)
    return ReplicaStatus(replica_id=replica_id, node_id="n", app="app", service="svc", version=1,
                         state=state, pid=1, started_at=0.0, updated_at=at, calls=calls,  # type: ignore[arg-type]
                         functions=[stats], start=start)


def reports(rate: float, per_call_s: float, replicas: int, ticks: int) -> list[list[ReplicaStatus]]:
    """What the control loop sees each tick: every replica reports every ``REPORT_S``, serving ``rate / replicas``."""
    out = []
    for tick in range(ticks):
        now = tick * TICK_S
        seen = []
        for i in range(replicas):
            at = math.floor((now - i * 0.3) / REPORT_S) * REPORT_S + i * 0.3  # staggered reports
            calls = max(round(at * rate / replicas), 0)
            seen.append(status(f"r{i}", at, calls, busy_s=calls * per_call_s, ready_s=12.0))
        out.append(seen)
    return out


def test_the_rate_holds_between_reports_instead_of_dropping_and_bursting() -> None:
    meter = Meter()
    rates = []
    for tick, seen in enumerate(reports(rate=30.0, per_call_s=0.02, replicas=3, ticks=40)):
        load, meter = measure(meter, seen, tick * TICK_S)
        rates.append(load.arrival_rate)
    settled = rates[12:]
    assert all(abs(r - 30.0) < 3.0 for r in settled), settled


def test_throughput_is_calls_run_per_second_busy() -> None:
    meter = Meter()
    load = None
    for tick, seen in enumerate(reports(rate=30.0, per_call_s=0.02, replicas=3, ticks=20)):
        load, meter = measure(meter, seen, tick * TICK_S)
    assert load is not None and load.throughput_per_replica is not None
    assert abs(load.throughput_per_replica - 50.0) < 1e-6  # 1 / 0.02 s


def test_nothing_measured_yet_means_no_throughput_and_no_startup() -> None:
    load, meter = measure(Meter(), [status("r0", 1.0, 0, state="starting")], 1.0)
    assert (load.arrival_rate, load.throughput_per_replica, load.startup_s) == (0.0, None, 0.0)
    assert measure(meter, [], 2.0)[1].replicas == {}  # a replica no longer listed is forgotten


def test_each_start_counts_once_and_recent_starts_weigh_more() -> None:
    load, meter = measure(Meter(), [status("r0", 1.0, 0, ready_s=10.0)], 1.0)
    assert load.startup_s == 10.0
    for t in (1.5, 2.0, 2.5):  # the same replica again: no new start
        load, meter = measure(meter, [status("r0", t, 0, ready_s=10.0)], t)
    assert load.startup_s == 10.0
    load, meter = measure(meter, [status("r0", 3.0, 0, ready_s=10.0), status("r1", 3.0, 0, ready_s=40.0)], 3.0)
    assert 10.0 < load.startup_s < 40.0


def test_a_restarted_replica_gives_no_negative_rate() -> None:
    _, meter = measure(Meter(), [status("r0", 2.0, 100, busy_s=1.0)], 2.0)
    load, meter = measure(meter, [status("r0", 4.0, 3, busy_s=0.05)], 4.0)  # its counters start again
    assert load.arrival_rate == 0.0
    load, _ = measure(meter, [status("r0", 6.0, 23, busy_s=0.45)], 6.0)
    assert load.arrival_rate == 10.0


def test_queues_and_calls_in_flight_are_summed_over_replicas() -> None:
    load, _ = measure(Meter(), [status("r0", 1.0, 0, queued=3, in_flight=1), status("r1", 1.0, 0, queued=2)], 1.0)
    assert (load.queue_depth, load.in_flight) == (5, 1)


def test_measured_load_scales_a_service_to_what_its_replicas_serve() -> None:
    """3 replicas serving 20 calls/s each, at 0.02 s a call (50 calls/s busy): 60 calls/s need
    ceil(60 / (50 * 0.8)) = 2 replicas once the scale-down window has passed, and never fewer."""
    config = AutoscaleConfig(min_replicas=1, max_replicas=10, scaledown_window_s=10)
    state, meter = initial_state(config), Meter()
    counts = []
    for tick, seen in enumerate(reports(rate=60.0, per_call_s=0.02, replicas=3, ticks=100)):
        now = tick * TICK_S
        load, meter = measure(meter, seen, now)
        signals = Signals(now=now, ready=3, arrival_rate=load.arrival_rate, in_flight=load.in_flight,
                          throughput_per_replica=load.throughput_per_replica, startup_s=load.startup_s)
        count, state = desired_replicas(signals, config, state)
        counts.append(count)
    assert counts[-1] == 2
    assert min(counts[10:]) == 2


def batched(replica_id: str, at: float, batches: int, size: int, max_size: int, *, run_s: float,
            waits: list[int] | None = None, runs: list[int] | None = None) -> ReplicaStatus:
    """A replica that ran ``batches`` batches of ``size`` (of at most ``max_size``), each taking ``run_s``;
    ``waits``/``runs``: its queue-wait and run-time histograms' counts over ``BOUNDS`` (and one above)."""
    calls = batches * size
    waits = waits or [calls, 0, 0, 0]
    runs = runs or [batches, 0, 0, 0]
    stats = FunctionStats(function="f", calls=calls, batches=batches, expired=0, rejected=0, cancelled=0, failed=0,
                          queue_depth=0, fill_ratio=size / max_size,
                          batch_size=histogram(float(calls), batches),
                          queue_wait_s=Histogram(bounds=BOUNDS, counts=waits, sum=0.0, count=sum(waits)),
                          run_s=Histogram(bounds=BOUNDS, counts=runs, sum=batches * run_s, count=sum(runs)))
    return ReplicaStatus(replica_id=replica_id, node_id="n", app="app", service="svc", version=1, state="ready",
                         pid=1, started_at=0.0, updated_at=at, calls=calls, functions=[stats])


BOUNDS = [0.01, 0.1, 1.0]


def test_the_gateway_s_received_rate_shows_an_overload_the_replicas_cannot() -> None:
    """Replicas run 10 calls/s while 40 calls/s arrive: the arrival rate is what arrives."""
    meter, load = Meter(), None
    for tick in range(20):
        now = tick * TICK_S
        seen = [status("r0", math.floor(now / REPORT_S) * REPORT_S, round(math.floor(now / REPORT_S) * REPORT_S * 10))]
        load, meter = measure(meter, seen, now, received=round(now * 40))
    assert load is not None and load.arrival_rate == 40.0


def test_the_gateway_s_rate_holds_within_its_window_and_the_larger_rate_wins() -> None:
    load, meter = measure(Meter(), [], 0.0, received=100)
    assert load.arrival_rate == 0.0  # a baseline
    load, meter = measure(meter, [], 1.0, received=150)
    assert load.arrival_rate == 0.0  # the window has not passed yet
    load, meter = measure(meter, [], 2.0, received=200)
    assert load.arrival_rate == 50.0
    load, meter = measure(meter, [], 2.5, received=200)
    assert load.arrival_rate == 50.0  # held
    _, meter = measure(Meter(), [status("r0", 0.0, 0)], 0.0, received=0)
    load, _ = measure(meter, [status("r0", 2.0, 60)], 2.0, received=10)  # spawned calls run: replicas' rate wins
    assert load.arrival_rate == 30.0


def test_a_restarted_gateway_counts_from_a_new_baseline() -> None:
    _, meter = measure(Meter(), [], 0.0, received=500)
    load, meter = measure(meter, [], 3.0, received=20)
    assert load.arrival_rate == 0.0
    load, _ = measure(meter, [], 5.0, received=40)
    assert load.arrival_rate == 10.0


def test_capacity_is_preferred_while_batches_are_small() -> None:
    """Batches of 2 of at most 32, 0.02 s each: 100 calls/s busy measured; the replica predicts 400 in full ones."""
    _, meter = measure(Meter(), [batched("r0", 0.0, 0, 2, 32, run_s=0.02)], 0.0)
    load, _ = measure(meter, [batched("r0", 2.0, 50, 2, 32, run_s=0.02)], 2.0, capacity=400.0)
    assert load.throughput_per_replica == 400.0
    load, _ = measure(meter, [batched("r0", 2.0, 50, 2, 32, run_s=0.02)], 2.0)  # no estimate: the measure
    assert load.throughput_per_replica == 100.0


def test_the_measure_wins_once_batches_fill() -> None:
    _, meter = measure(Meter(), [batched("r0", 0.0, 0, 24, 32, run_s=0.1)], 0.0)
    load, _ = measure(meter, [batched("r0", 2.0, 10, 24, 32, run_s=0.1)], 2.0, capacity=400.0)
    assert load.throughput_per_replica == 240.0  # 24 calls per 0.1 s


def test_capacity_stands_in_before_anything_is_measured() -> None:
    load, _ = measure(Meter(), [status("r0", 1.0, 0)], 1.0, capacity=25.0)
    assert load.throughput_per_replica == 25.0


def test_p95_is_queue_wait_plus_run_time_of_the_calls_since_the_last_reports() -> None:
    """Before: 1000 fast calls (ignored, they precede the first report seen). Then 100 calls in batches of one:
    waits all under 10 ms; runs 90 under 10 ms and 10 between 10 and 100 ms."""
    _, meter = measure(Meter(), [batched("r0", 0.0, 1000, 1, 1, run_s=0.005)], 0.0)
    load, meter = measure(meter, [batched("r0", 2.0, 1100, 1, 1, run_s=0.005, waits=[1100, 0, 0, 0],
                                          runs=[1090, 10, 0, 0])], 2.0)
    assert load.p95_ms is not None
    wait_p95, run_p95 = 9.5, 10.0 + 90.0 * 0.5  # interpolated within their buckets
    assert math.isclose(load.p95_ms, wait_p95 + run_p95)
    later, _ = measure(meter, [batched("r0", 2.0, 1100, 1, 1, run_s=0.005, waits=[1100, 0, 0, 0],
                                       runs=[1090, 10, 0, 0])], 2.5)  # no new report: the same calls, decayed
    assert later.p95_ms is not None and math.isclose(later.p95_ms, load.p95_ms)


def test_p95_is_none_until_batches_have_run_and_survives_a_restart() -> None:
    _, meter = measure(Meter(), [batched("r0", 0.0, 0, 1, 1, run_s=0.0, waits=[0] * 4, runs=[0] * 4)], 0.0)
    load, meter = measure(meter, [batched("r0", 2.0, 1, 1, 1, run_s=0.0, runs=[0, 1, 0, 0])], 2.0)
    assert load.p95_ms is None  # one batch says little
    load, _ = measure(meter, [batched("r0", 4.0, 5, 1, 1, run_s=0.0, runs=[0, 0, 0, 5])], 4.0)  # counts restarted
    assert load.p95_ms is not None and load.p95_ms >= 1000.0  # the slow ones count, read at the highest bound


def test_a_measured_p95_over_target_scales_up_while_calls_queue() -> None:
    config = AutoscaleConfig(min_replicas=1, max_replicas=10, target_p95_ms=50)
    state = initial_state(config)
    _, meter = measure(Meter(), [batched("r0", 0.0, 0, 1, 1, run_s=0.0, waits=[0] * 4, runs=[0] * 4)], 0.0)
    load, meter = measure(meter, [batched("r0", 2.0, 20, 1, 1, run_s=0.3, waits=[0, 20, 0, 0],
                                          runs=[0, 0, 20, 0])], 2.0)
    assert load.p95_ms is not None and load.p95_ms > 50
    signals = Signals(now=2.0, ready=1, queue_depth=3, p95_ms=load.p95_ms)
    count, _ = desired_replicas(signals, config, state)
    assert count == 2
