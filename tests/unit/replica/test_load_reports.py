"""A replica's load reports: a changed one goes at once, an unchanged one again only every ``IDLE_REPORT_S`` (an
idle replica sends a fifth of the messages, still fresh for the router)."""

from __future__ import annotations

import msgspec

from ember.wire import LoadReport
from ember_platform.calls.choice import REPORT_FRESH_S
from ember_runtime.replica.process import IDLE_REPORT_S, LOAD_REPORT_S, report_due

IDLE = LoadReport(replica_id="r1", app="a", function="f", version=1, queued=0, in_flight=0, per_call_s=0.001, slots=1)


def test_the_first_report_is_due():
    assert report_due(IDLE, None, 10.0)


def test_an_unchanged_report_waits_for_the_idle_period():
    assert not report_due(IDLE, (IDLE, 10.0), 10.0 + LOAD_REPORT_S)
    assert not report_due(IDLE, (IDLE, 10.0), 10.0 + IDLE_REPORT_S - 0.01)
    assert report_due(IDLE, (IDLE, 10.0), 10.0 + IDLE_REPORT_S)


def test_a_changed_report_goes_at_once():
    for change in ({"queued": 1}, {"in_flight": 1}, {"per_call_s": 0.002}):
        assert report_due(msgspec.structs.replace(IDLE, **change), (IDLE, 10.0), 10.0 + LOAD_REPORT_S)


def test_an_idle_replica_stays_fresh_for_the_router():
    assert IDLE_REPORT_S + LOAD_REPORT_S < REPORT_FRESH_S
