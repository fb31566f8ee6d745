"""Ember's scheduler policies: pure functions of an immutable snapshot, returning decisions.

The control loop does the I/O: it builds a ``Snapshot`` from the nodes' inventory and the replicas
that exist, reads each function's load from its replicas' reports with ``measure``, asks
``desired_replicas`` how many replicas each function needs, ``place`` where new ones go and
``rebalance`` which running ones to move (make-before-break), enacts the decisions, and carries the
snapshot forward with ``apply_decisions`` (or ``place_and_apply``, both in one go).

Example:
    >>> cluster = Cluster.from_nodes(node_infos)
    >>> snap = build_snapshot(cluster, reservations)
    >>> decisions = place(snap, [PlacementRequest(replica_id="r-1", function="app.fn", gpu=parse_gpu("24GB"))])
"""

from ember_platform.scheduler.autoscale import (
    AutoscaleConfig,
    AutoscaleState,
    Signals,
    desired_replicas,
    initial_state,
)
from ember_platform.scheduler.decision import Binding, Decision, Unschedulable
from ember_platform.scheduler.measure import Load, Meter, measure
from ember_platform.scheduler.placement import apply_decisions, describe, place, place_and_apply
from ember_platform.scheduler.rebalance import Move, MoveBudget, rebalance
from ember_platform.scheduler.request import GpuRequest, PlacementRequest, Priority, parse_gpu, request_from_spec
from ember_platform.scheduler.reservations import build_snapshot
from ember_platform.scheduler.snapshot import Cluster, Reservation, Snapshot

__all__ = [
    "AutoscaleConfig",
    "AutoscaleState",
    "Binding",
    "Cluster",
    "Decision",
    "GpuRequest",
    "Load",
    "Meter",
    "Move",
    "MoveBudget",
    "PlacementRequest",
    "Priority",
    "Reservation",
    "Signals",
    "Snapshot",
    "Unschedulable",
    "apply_decisions",
    "build_snapshot",
    "describe",
    "desired_replicas",
    "initial_state",
    "measure",
    "parse_gpu",
    "place",
    "place_and_apply",
    "rebalance",
    "request_from_spec",
]
