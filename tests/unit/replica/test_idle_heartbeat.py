"""A replica's heartbeat (its status, written through its agent into ``ember_replicas``): written every 2 s while
something changes, once more when nothing did (the scheduler's call rate then reads zero: rates hold between
writes), then only every ``IDLE_HEARTBEAT_S``, well inside the bucket's 15 s memory."""

from __future__ import annotations

import math

import msgspec

from ember.wire import ReplicaStatus
from ember.wire.jetstream import REPLICA_TTL_S
from ember_runtime.replica.reports import HEARTBEAT_S, IDLE_HEARTBEAT_S, heartbeat_due

LAST = ReplicaStatus(replica_id="r1", node_id="n1", app="a", service="s", version=1, state="ready", pid=1,
                     started_at=1.0, updated_at=100.0, calls=10, batches=4)


def test_a_changed_status_is_written_at_once():
    for change in ({"calls": 11}, {"batches": 5}, {"state": "stopping"}, {"message": "x"}):
        assert heartbeat_due(msgspec.structs.replace(LAST, **change), LAST, 3, 100.0 + HEARTBEAT_S)


def test_an_unchanged_status_is_written_once_then_only_every_idle_period():
    assert heartbeat_due(LAST, LAST, 0, 100.0 + HEARTBEAT_S)  # the write that says "no calls since"
    assert not heartbeat_due(LAST, LAST, 1, 100.0 + HEARTBEAT_S)
    assert not heartbeat_due(LAST, LAST, 1, 100.0 + IDLE_HEARTBEAT_S - 0.01)
    assert heartbeat_due(LAST, LAST, 1, 100.0 + IDLE_HEARTBEAT_S)


def test_an_idle_replica_outlives_its_bucket_ttl():
    spacing = math.ceil(IDLE_HEARTBEAT_S / HEARTBEAT_S) * HEARTBEAT_S  # the heartbeat looks every HEARTBEAT_S
    assert 2 * spacing < REPLICA_TTL_S  # one lost write does not make an idle replica vanish
