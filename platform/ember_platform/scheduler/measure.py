"""``measure``: a service's load, read from its replicas' reports, as the autoscaler's ``Signals`` want it.

Replicas report cumulative counters (calls, batch sizes, seconds spent running batches, latency histograms)
every few seconds, not on every control tick. So a rate is taken per replica between two of its own reports,
and summed over the replicas: a tick that sees no new report does not read as a drop to zero, nor the next
one as a burst.

- arrival rate: the larger of the calls the replicas ran per second and the synchronous calls the gateway
  received per second (``received``, its cumulative count, turned into a rate over at least
  ``_GATEWAY_WINDOW_S``): an overloaded service runs only what its replicas manage, while the gateway sees
  what arrives. Spawned calls that wait show through the durable backlog instead;
- throughput: calls run per second spent running batches, i.e. what one replica serves while busy,
  averaged over about ``_THROUGHPUT_S``, or the replicas' own estimate while batches are small (see
  ``_throughput``); ``None`` until known;
- start-up: each replica's decision-to-ready time (its ``StartPhases.ready_s``), averaged over the
  replicas that started, recent ones weighing more;
- p95: the 95th percentile of queue wait plus that of run time, from the replicas' histograms differenced
  between reports and averaged over about ``_LATENCY_S``; ``None`` until a few batches have run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from ember.wire import Histogram, ReplicaStatus

_THROUGHPUT_S = 60.0  # time constant of the throughput average
_LATENCY_S = 10.0  # time constant of the latency histograms' average: recent, as the autoscaler's rate
_STARTUP_WEIGHT = 0.3  # of the latest start in the start-up average
_MIN_BUSY_S = 0.01  # seconds of measured work below which throughput is not trusted yet
_MIN_BATCHES = 3.0  # batches (decayed) below which no p95 is given
_GATEWAY_WINDOW_S = 2.0  # the gateway's count becomes a rate over at least this long (as often as replicas report)
_SMALL_FILL = 0.5  # batches filled below this share of their maximum on average are "small"


class Spread(NamedTuple):
    """Observations per bucket of a histogram, laid out as ``Histogram`` (the last bucket is above all bounds)."""

    bounds: tuple[float, ...] = ()
    counts: tuple[float, ...] = ()

    @classmethod
    def of(cls, histograms: Iterable[Histogram]) -> Spread:
        """The histograms added up (those whose bounds differ from the first one's are left out)."""
        total = cls()
        for h in histograms:
            total = total.plus(cls(tuple(h.bounds), tuple(float(c) for c in h.counts)))
        return total

    def plus(self, other: Spread) -> Spread:
        if not other.counts:
            return self
        if not self.counts or self.bounds != other.bounds:
            return other if not self.counts else self
        return Spread(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts, strict=True)))

    def since(self, earlier: Spread) -> Spread:
        """What was observed after ``earlier``; all of it when the counters started again (a restart)."""
        if earlier.bounds != self.bounds or len(earlier.counts) != len(self.counts):
            return self if not earlier.counts else Spread()
        if any(b < a for a, b in zip(earlier.counts, self.counts, strict=True)):
            return self
        return Spread(self.bounds, tuple(b - a for a, b in zip(earlier.counts, self.counts, strict=True)))

    def scaled(self, factor: float) -> Spread:
        return Spread(self.bounds, tuple(c * factor for c in self.counts))

    def total(self) -> float:
        return sum(self.counts)

    def quantile(self, q: float) -> float | None:
        """Interpolated within its bucket, as Prometheus' ``histogram_quantile``; the bucket above all bounds
        reads as the highest bound. None without observations or bounds."""
        total = self.total()
        if total <= 0 or not self.bounds:
            return None
        rank, below = q * total, 0.0
        for i, count in enumerate(self.counts):
            if count > 0 and below + count >= rank:
                if i >= len(self.bounds):
                    return self.bounds[-1]
                low = self.bounds[i - 1] if i else 0.0
                return low + (self.bounds[i] - low) * (rank - below) / count
            below += count
        return self.bounds[-1]


class Counters(NamedTuple):
    """One replica's counters at its last report, and its call rate between its last two reports."""

    at: float  # the report's ``updated_at``
    calls: int
    served: float  # calls run in batches (the batch-size histograms' sum)
    busy_s: float  # seconds spent running batches
    rate: float = 0.0
    started: bool = False  # its start-up time has been counted
    batches: float = 0.0
    fill: float = 0.0  # each batch's size over its maximum, summed over the batches
    waits: Spread = Spread()  # queue wait of each call, all functions together
    runs: Spread = Spread()  # run time of each batch


class Meter(msgspec.Struct, frozen=True, kw_only=True):
    """What ``measure`` carries from one tick to the next for one service."""

    replicas: dict[str, Counters] = {}
    served: float = 0.0  # calls run, decayed over ``_THROUGHPUT_S``
    busy_s: float = 0.0  # seconds running them, decayed alike
    startup_s: float | None = None
    at: float | None = None
    batches: float = 0.0  # batches run, decayed over ``_THROUGHPUT_S``
    fill: float = 0.0  # their fill ratios summed, decayed alike
    waits: Spread = Spread()  # decayed over ``_LATENCY_S``
    runs: Spread = Spread()
    received: int | None = None  # the gateway's count at the start of its current window
    received_at: float | None = None
    received_rate: float = 0.0  # over its last full window


class Load(NamedTuple):
    arrival_rate: float  # calls per second, all replicas together
    throughput_per_replica: float | None
    startup_s: float  # 0.0 until a replica has started
    queue_depth: int
    in_flight: int
    p95_ms: float | None = None  # queue wait plus run time, recent calls


def measure(meter: Meter, replicas: Iterable[ReplicaStatus], now: float, *, received: int | None = None,
            capacity: float | None = None) -> tuple[Load, Meter]:
    """The load now, and the meter for the next tick; replicas no longer listed are forgotten.

    ``received``: synchronous calls the gateway has received for the service so far (None: not known);
    ``capacity``: calls per second one replica serves in full batches, by its own estimate (None: not known).
    """
    seen: dict[str, Counters] = {}
    served = busy = batches = fill = 0.0
    waits = runs = Spread()
    startup = meter.startup_s
    queued = in_flight = 0
    for r in replicas:
        last = meter.replicas.get(r.replica_id)
        counters = seen[r.replica_id] = _counters(r, last)
        if r.start is not None and (last is None or not last.started):  # each start is counted once
            startup = _average(startup, r.start.ready_s)
        base = last or _NOTHING
        served += max(counters.served - base.served, 0.0)
        busy += max(counters.busy_s - base.busy_s, 0.0)
        batches += max(counters.batches - base.batches, 0.0)
        fill += max(counters.fill - base.fill, 0.0)
        if last is not None:  # a first report is a baseline: what it counts happened before
            waits, runs = waits.plus(counters.waits.since(last.waits)), runs.plus(counters.runs.since(last.runs))
        queued += sum(f.queue_depth for f in r.functions)
        in_flight += sum(f.in_flight for f in r.functions)
    elapsed = now - meter.at if meter.at is not None else math.inf
    decay, fade = math.exp(-elapsed / _THROUGHPUT_S), math.exp(-elapsed / _LATENCY_S)
    served, busy = meter.served * decay + served, meter.busy_s * decay + busy
    batches, fill = meter.batches * decay + batches, meter.fill * decay + fill
    waits, runs = meter.waits.scaled(fade).plus(waits), meter.runs.scaled(fade).plus(runs)
    gateway, count, since = _gateway_rate(meter, received, now)
    load = Load(arrival_rate=max(sum(c.rate for c in seen.values()), gateway),
                throughput_per_replica=_throughput(served, busy, fill / batches if batches else None, capacity),
                startup_s=startup or 0.0, queue_depth=queued, in_flight=in_flight, p95_ms=_p95_ms(waits, runs))
    return load, Meter(replicas=seen, served=served, busy_s=busy, startup_s=startup, at=now, batches=batches,
                       fill=fill, waits=waits, runs=runs, received=count, received_at=since, received_rate=gateway)


def _throughput(served: float, busy: float, fill: float | None, capacity: float | None) -> float | None:
    """Calls per second one busy replica serves.

    The measure, calls run per second spent running batches, holds at the batch sizes the load formed. A
    batching function under light load runs small batches, each call paying most of a batch's fixed cost, and
    that understates what a replica serves once more load fills its batches. So while the batches were filled
    to less than ``_SMALL_FILL`` of their maximum on average (or nothing has been measured yet), the replicas'
    own estimate is preferred: ``capacity``, from their predicted cost of one call in a full batch. Once
    batches are fuller, the measure, which includes every overhead the prediction leaves out, is the truth.
    A function that does not batch always fills its batches of one, so it is always measured.
    """
    measured = served / busy if busy >= _MIN_BUSY_S and served > 0 else None
    if capacity is not None and capacity > 0 and (measured is None or fill is None or fill < _SMALL_FILL):
        return capacity
    return measured


def _p95_ms(waits: Spread, runs: Spread) -> float | None:
    """The p95 of queue wait plus the p95 of run time. The two are not observed jointly, so the sum of their
    quantiles stands for the quantile of their sum: exact when slow runs and long waits come together (as
    they do under load, where waits are made of slow runs), an overestimate otherwise."""
    if runs.total() < _MIN_BATCHES:
        return None
    run = runs.quantile(0.95)
    if run is None:
        return None
    return 1000.0 * (run + (waits.quantile(0.95) or 0.0))


def _gateway_rate(meter: Meter, received: int | None, now: float) -> tuple[float, int | None, float | None]:
    """The gateway's rate, and its window's start count and time: a new rate once a window has passed, the last
    one in between (as a replica's rate holds between its reports)."""
    if received is None:
        return 0.0, None, None
    if meter.received is None or meter.received_at is None or received < meter.received:  # a baseline
        return 0.0, received, now
    span = now - meter.received_at
    if span < _GATEWAY_WINDOW_S:
        return meter.received_rate, meter.received, meter.received_at
    return (received - meter.received) / span, received, now


def _counters(r: ReplicaStatus, last: Counters | None) -> Counters:
    if last is not None and r.updated_at <= last.at:  # no new report since the last tick
        return last._replace(started=r.start is not None)
    served = sum(f.batch_size.sum for f in r.functions)
    busy = sum(f.run_s.sum for f in r.functions)
    batches = float(sum(f.batches for f in r.functions))
    fill = sum(f.fill_ratio * f.batches for f in r.functions)
    waits, runs = Spread.of(f.queue_wait_s for f in r.functions), Spread.of(f.run_s for f in r.functions)
    rate = 0.0 if last is None else max(r.calls - last.calls, 0) / (r.updated_at - last.at)  # first: a baseline
    return Counters(r.updated_at, r.calls, served, busy, rate, r.start is not None, batches, fill, waits, runs)


def _average(current: float | None, latest: float) -> float:
    return latest if current is None else current + _STARTUP_WEIGHT * (latest - current)


_NOTHING = Counters(0.0, 0, 0.0, 0.0)
