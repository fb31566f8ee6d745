"""Load measured from replicas' reports: rates between a replica's own reports, throughput, start-up time."""

from __future__ import annotations

import math

from ember._wire import FunctionStats, Histogram, ReplicaStatus, StartPhases
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
