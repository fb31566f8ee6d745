"""Which replicas a scale-down stops: what serves nothing first, then what still starts, then ready ones (the
highest index first within each), never one in a move or being replaced."""

from __future__ import annotations

from ember.wire import ReplicaStatus, SlotAssignment
from ember_platform.control.plan import surplus


def _service(*states: str) -> tuple[list[SlotAssignment], dict[str, ReplicaStatus]]:
    """Replicas r0, r1, ... of one service in ``states`` ("absent": assigned, never reported)."""
    slots = [SlotAssignment(replica_id=f"r{i}", app="a", service="m", version=1, index=i) for i in range(len(states))]
    replicas = {f"r{i}": ReplicaStatus(replica_id=f"r{i}", node_id="n1", app="a", service="m", version=1, state=state,
                                       pid=1, started_at=0.0, updated_at=0.0)
                for i, state in enumerate(states) if state != "absent"}
    return slots, replicas


def test_a_scale_down_keeps_the_ready_replica_and_stops_the_one_still_loading() -> None:
    assert surplus(*_service("ready", "starting"), 1) == {"r1"}  # the ready one (r0) was stopped before


def test_failed_and_unreported_replicas_go_before_any_that_serves() -> None:
    assert surplus(*_service("failed", "ready"), 1) == {"r0"}
    assert surplus(*_service("ready", "absent", "ready", "crashed"), 2) == {"r1", "r3"}


def test_among_ready_replicas_the_highest_index_goes_and_kept_ones_never() -> None:
    slots, replicas = _service("ready", "ready", "ready")
    assert surplus(slots, replicas, 2) == {"r2", "r1"}
    assert surplus(slots, replicas, 2, keep={"r2"}) == {"r1", "r0"}
    assert surplus(slots, replicas, 0) == set()
