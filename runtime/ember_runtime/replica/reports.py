"""How often a replica tells what it does: its load reports (to the gateways, for routing) and its status (through
its agent into ``ember_replicas``, for the scheduler). Busy, often; idle, rarely: an idle platform's CPU is mostly
these messages."""

from __future__ import annotations

from ember.wire import LoadReport, ReplicaStatus
from ember_runtime.batching.batcher import Batcher
from ember_runtime.replica.continuous import StepLoop

HEARTBEAT_S = 2.0
IDLE_HEARTBEAT_S = 5.0  # an unchanged status is written again after this (its bucket forgets it after 15 s)
LOAD_REPORT_S = 0.1
IDLE_REPORT_S = 2.0  # an unchanged load report of nothing queued or running is sent again this often
BUSY_REPORT_S = 0.25  # an unchanged busy one, this often: well within the router's REPORT_FRESH_S (2 s), or a
#                       replica whose load holds still (long streams) drops out of the routing between two reports
#                       (at 0.5 s against 1 s, a loaded 2-core machine's late reports did so in test_stream_routing)


def heartbeat_due(status: ReplicaStatus, last: ReplicaStatus, repeats: int, now: float) -> bool:
    """Whether the heartbeat writes ``status`` (the status now, its ``updated_at`` still the last write's) after
    ``last``, the status written last, which repeated the one before it ``repeats`` times: always when something
    changed; when nothing did, once (so that the scheduler reads a call rate of zero from it: rates hold between
    writes), then only every ``IDLE_HEARTBEAT_S`` (an idle replica's writes went through its agent into a bucket
    every 2 s)."""
    if status != last:
        return True
    return repeats == 0 or now - last.updated_at >= IDLE_HEARTBEAT_S


def report_due(report: LoadReport, last: tuple[LoadReport, float] | None, now: float) -> bool:
    """Whether to publish ``report``: it differs from the last one sent, or that one is ``IDLE_REPORT_S`` old
    (``BUSY_REPORT_S`` for a report of calls queued or running): an unchanged report keeps the replica fresh for
    the router, which counts a report of nothing queued or running for ``IDLE_FRESH_S``, 5 s, and a busy one for
    ``REPORT_FRESH_S``, 2 s."""
    if last is None or last[0] != report:
        return True
    idle = report.queued == 0 and report.in_flight == 0
    return now - last[1] >= (IDLE_REPORT_S if idle else BUSY_REPORT_S)


def in_flight(batcher: Batcher, steps: StepLoop | None) -> int:
    """The calls a function runs now, as its load reports count them: a Continuous method's running sequences too,
    which its step loop holds past their calls' end while a step is under way (a step that hangs holds every one,
    though the batcher freed their slots at their deadlines)."""
    return max(batcher.in_flight, steps.running) if steps is not None else batcher.in_flight


def running_since(batcher: Batcher, steps: StepLoop | None) -> float | None:
    """When the oldest work a function runs now began (monotonic), as the stuck watch sees it: its oldest batch,
    or a Continuous method's step under way (its calls' batches end at their deadlines, the step goes on)."""
    since = [t for t in (batcher.running_since, steps.step_since if steps is not None else None) if t is not None]
    return min(since, default=None)
