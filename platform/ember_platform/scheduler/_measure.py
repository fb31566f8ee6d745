"""``measure``: a service's load, read from its replicas' reports, as the autoscaler's ``Signals`` want it.

Replicas report cumulative counters (calls, batch sizes, seconds spent running batches) every few seconds,
not on every control tick. So a rate is taken per replica between two of its own reports, and summed over
the replicas: a tick that sees no new report does not read as a drop to zero, nor the next one as a burst.

- throughput: calls run per second spent running batches, i.e. what one replica serves while busy,
  averaged over about ``_THROUGHPUT_S``; ``None`` until some call has run;
- start-up: each replica's decision-to-ready time (its ``StartPhases.ready_s``), averaged over the
  replicas that started, recent ones weighing more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from ember._wire import ReplicaStatus

_THROUGHPUT_S = 60.0  # time constant of the throughput average
_STARTUP_WEIGHT = 0.3  # of the latest start in the start-up average
_MIN_BUSY_S = 0.01  # seconds of measured work below which throughput is not trusted yet


class Counters(NamedTuple):
    """One replica's counters at its last report, and its call rate between its last two reports."""

    at: float  # the report's ``updated_at``
    calls: int
    served: float  # calls run in batches (the batch-size histograms' sum)
    busy_s: float  # seconds spent running batches
    rate: float = 0.0
    started: bool = False  # its start-up time has been counted


class Meter(msgspec.Struct, frozen=True, kw_only=True):
    """What ``measure`` carries from one tick to the next for one service."""

    replicas: dict[str, Counters] = {}
    served: float = 0.0  # calls run, decayed over ``_THROUGHPUT_S``
    busy_s: float = 0.0  # seconds running them, decayed alike
    startup_s: float | None = None
    at: float | None = None


class Load(NamedTuple):
    arrival_rate: float  # calls per second, all replicas together
    throughput_per_replica: float | None
    startup_s: float  # 0.0 until a replica has started
    queue_depth: int
    in_flight: int


def measure(meter: Meter, replicas: Iterable[ReplicaStatus], now: float) -> tuple[Load, Meter]:
    """The load now, and the meter for the next tick; replicas no longer listed are forgotten."""
    seen: dict[str, Counters] = {}
    served = busy = 0.0
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
        queued += sum(f.queue_depth for f in r.functions)
        in_flight += sum(f.in_flight for f in r.functions)
    decay = math.exp(-(now - meter.at) / _THROUGHPUT_S) if meter.at is not None else 0.0
    served, busy = meter.served * decay + served, meter.busy_s * decay + busy
    throughput = served / busy if busy >= _MIN_BUSY_S and served > 0 else None
    load = Load(arrival_rate=sum(c.rate for c in seen.values()), throughput_per_replica=throughput,
                startup_s=startup or 0.0, queue_depth=queued, in_flight=in_flight)
    return load, Meter(replicas=seen, served=served, busy_s=busy, startup_s=startup, at=now)


def _counters(r: ReplicaStatus, last: Counters | None) -> Counters:
    served = sum(f.batch_size.sum for f in r.functions)
    busy = sum(f.run_s.sum for f in r.functions)
    started = r.start is not None
    if last is None:  # the first report: a baseline, no rate yet
        return Counters(r.updated_at, r.calls, served, busy, 0.0, started)
    if r.updated_at <= last.at:  # no new report since the last tick
        return last._replace(started=started)
    rate = max(r.calls - last.calls, 0) / (r.updated_at - last.at)
    return Counters(r.updated_at, r.calls, served, busy, rate, started)


def _average(current: float | None, latest: float) -> float:
    return latest if current is None else current + _STARTUP_WEIGHT * (latest - current)


_NOTHING = Counters(0.0, 0, 0.0, 0.0)
