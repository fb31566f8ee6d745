"""``desired_replicas``: how many replicas a function should have, from one tick of its signals.

The need is the largest of three estimates, in replicas:

- concurrency: calls running over ``target_in_flight`` per replica (Little's law); while no
  throughput has been measured, queued and durable pending calls count as running ones;
- rate: the arrival rate, projected ``startup_s`` ahead along its rising trend (a replica started
  now serves only then: the headroom is the growth rate times the start-up time), over the measured
  per-replica throughput at ``target_utilization``, plus what drains the backlog (queued and durable
  pending calls) within ``startup_s + drain_s``. The trend is averaged over ``startup_s`` (at least
  ``_SMOOTHING_S``), so that projecting it further does not project its noise further;
- latency: one more replica than now while p95 exceeds its target, calls are queueing and no
  replica is starting (a replica on its way is the remedy already under way).

Hysteresis: a higher count is taken at once; a lower one only after the need has stayed below the
current count, by more than ``scaledown_tolerance`` of it, for ``scaledown_window_s``, and then to the
highest need seen in that window (the tolerance keeps a noisy load from trading one replica back and
forth, as Kubernetes' HPA does with its 10%).
``buffer_replicas`` idle spares are kept while there is load; the count stays within
``[min_replicas, max_replicas]`` and never drops below the replicas still starting.
"""

from __future__ import annotations

import math

import msgspec

from ember._errors import InvalidSpecError

_SMOOTHING_S = 10.0  # time constant of the rate and trend averages
_LATENCY_SLACK = 1.05
_NEGLIGIBLE = 1e-6  # calls/s: a rate this small has decayed to nothing


class Signals(msgspec.Struct, frozen=True, kw_only=True):
    """One function's load at one tick, as the control loop measured it."""

    now: float  # seconds on the loop's clock
    ready: int = 0
    starting: int = 0  # replicas not ready yet: never removed for scaling down
    queue_depth: int = 0  # calls waiting in replicas and at the gateway
    durable_pending: int = 0  # calls pending in the function's durable work queue
    in_flight: int = 0  # calls running now, all replicas together
    arrival_rate: float = 0.0  # calls per second over the last tick
    throughput_per_replica: float | None = None  # calls per second one busy replica serves; None: not measured
    p95_ms: float | None = None  # recent calls' queue wait plus run time; None: not measured
    startup_s: float = 0.0  # how long a new replica takes to become ready, as measured


class AutoscaleConfig(msgspec.Struct, frozen=True, kw_only=True):
    min_replicas: int = 0
    max_replicas: int = 1
    buffer_replicas: int = 0
    target_in_flight: float = 2.0  # calls per replica (Ray Serve's default target_ongoing_requests)
    target_utilization: float = 0.8  # of the measured throughput
    target_p95_ms: float | None = None  # the service's latency target (its target_p95_ms=); None: none
    scaledown_window_s: float = 60.0
    scaledown_tolerance: float = 0.1  # a need this close below the count (a share of it) keeps the count
    drain_s: float = 30.0

    def __post_init__(self) -> None:
        checks = [
            (not 0 <= self.min_replicas <= self.max_replicas, "need 0 <= min_replicas <= max_replicas"),
            (self.max_replicas < 1, "max_replicas must be >= 1"),
            (self.buffer_replicas < 0, "buffer_replicas must be >= 0"),
            (self.target_in_flight <= 0, "target_in_flight must be > 0"),
            (not 0 < self.target_utilization <= 1, "target_utilization is a share in (0, 1]"),
            (self.scaledown_window_s < 0 or self.drain_s <= 0, "scaledown_window_s >= 0 and drain_s > 0"),
            (not 0 <= self.scaledown_tolerance < 1, "scaledown_tolerance is a share in [0, 1)"),
            (self.target_p95_ms is not None and not self.target_p95_ms > 0, "target_p95_ms must be > 0 or None"),
        ]
        problem = next((message for failed, message in checks if failed), None)
        if problem:
            raise InvalidSpecError(f"{self!r}: {problem}")


class AutoscaleState(msgspec.Struct, frozen=True, kw_only=True):
    desired: int
    below_since: float | None = None  # when the need fell below ``desired``
    window_peak: int = 0  # the highest need since then
    rate: float = 0.0  # smoothed arrival rate
    trend: float = 0.0  # smoothed change of the rate, calls/s per s
    at: float | None = None  # the last tick's time


def in_flight_target(max_concurrency: int) -> float:
    """Calls in flight per replica to aim for: ``target_in_flight``'s default of 2 for a replica that runs one call
    at a time; 80 % of its slots for one that runs ``max_concurrency`` calls at once."""
    return max(2.0, 0.8 * max_concurrency)


def initial_state(config: AutoscaleConfig, running: int = 0) -> AutoscaleState:
    """The state of a service first seen by this control loop: a new one starts at ``min_replicas``; one that
    already runs ``running`` replicas (a control plane that restarted or took over) keeps them, within its
    bounds, and scales down from there only after its window, as if it had just decided that count."""
    return AutoscaleState(desired=min(max(running, config.min_replicas), config.max_replicas))


def desired_replicas(signals: Signals, config: AutoscaleConfig,
                     state: AutoscaleState) -> tuple[int, AutoscaleState]:
    """The replica count to run now, and the state to pass to the next tick.

    It runs for every function on every tick, so it is written to be cheap: no work at all for a function at
    rest, and a handful of arithmetic operations otherwise.
    """
    s = signals
    if not (s.arrival_rate or s.queue_depth or s.durable_pending or s.in_flight or s.starting) and _at_rest(
            config, state):  # most functions, most of the time: nothing to compute
        return state.desired, state
    rate, trend = _smooth(s, state)
    need = _need(s, config, state.desired, trend)
    low, high = config.min_replicas, config.max_replicas  # clamps written out: this line runs 10^4 times a tick
    wanted = need + config.buffer_replicas if need > 0 else 0
    wanted = low if wanted < low else high if wanted > high else wanted
    if wanted >= state.desired * (1.0 - config.scaledown_tolerance):  # more, or within the tolerance: no window
        count, below_since, peak = (wanted if wanted > state.desired else state.desired), None, 0
    else:
        count, below_since, peak = _scale_down(wanted, s.now, config, state)
    if count < s.starting:
        count = s.starting
    count = low if count < low else high if count > high else count
    return count, AutoscaleState(desired=count, below_since=below_since, window_peak=peak, rate=rate, trend=trend,
                                 at=s.now)


def _at_rest(config: AutoscaleConfig, state: AutoscaleState) -> bool:
    """Idle signals leave the state as it is once it has settled at ``min_replicas``."""
    return (state.desired == config.min_replicas and state.below_since is None and state.rate == 0.0
            and state.trend == 0.0)


def _need(s: Signals, config: AutoscaleConfig, current: int, trend: float) -> int:
    throughput = s.throughput_per_replica
    if throughput:  # queued calls are drained over time, not given a replica each
        projected = s.arrival_rate + trend * s.startup_s if trend > 0 else s.arrival_rate
        need = (projected / (throughput * config.target_utilization)
                + (s.queue_depth + s.durable_pending) / (throughput * (s.startup_s + config.drain_s)))
        busy = s.in_flight / config.target_in_flight
        if busy > need:
            need = busy
    else:
        need = (s.in_flight + s.queue_depth + s.durable_pending) / config.target_in_flight
    target, p95 = config.target_p95_ms, s.p95_ms
    if target and p95 and p95 > target * _LATENCY_SLACK and s.queue_depth and not s.starting and need < current + 1:
        need = current + 1  # slow while calls queue: one more at a time, once the last one is up
    return math.ceil(need - 1e-9)


def _scale_down(wanted: int, now: float, config: AutoscaleConfig,
                state: AutoscaleState) -> tuple[int, float | None, int]:
    """``wanted`` is below the count: the count, and the window's start and peak, after this tick."""
    if state.below_since is None:
        return (wanted, None, 0) if config.scaledown_window_s == 0 else (state.desired, now, wanted)
    peak = max(state.window_peak, wanted)
    if now - state.below_since >= config.scaledown_window_s:
        return peak, None, 0
    return state.desired, state.below_since, peak


def _smooth(s: Signals, state: AutoscaleState) -> tuple[float, float]:
    """The arrival rate averaged over about ``_SMOOTHING_S``, and its trend averaged over at least as long as a
    replica takes to start: the trend is projected that far ahead, so its noise must not grow with it."""
    if state.at is None:
        return s.arrival_rate, 0.0
    dt = s.now - state.at
    if dt < 1e-6:
        dt = 1e-6
    alpha = 1.0 - math.exp(-dt / _SMOOTHING_S)
    beta = alpha if s.startup_s <= _SMOOTHING_S else 1.0 - math.exp(-dt / s.startup_s)
    last = state.rate
    rate = last + alpha * (s.arrival_rate - last)
    trend = state.trend + beta * ((rate - last) / dt - state.trend)
    return (rate if rate > _NEGLIGIBLE else 0.0), (0.0 if -_NEGLIGIBLE <= trend <= _NEGLIGIBLE else trend)
