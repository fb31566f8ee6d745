"""Which streams a replica's load report counts: ``choice.Unreported`` (a gateway's streams sent to each replica that
its last report does not count yet) and the choice of a replica for a new stream made with it. The two gateways
and replicas of tests/integration/test_stream_routing.py run the same code against real processes."""

from __future__ import annotations

import random

from ember.wire import LoadReport
from ember_platform.calls import choice


def report(replica: str, running: int, accepted: int) -> LoadReport:
    return LoadReport(replica_id=replica, app="a", function="f", version=1, queued=0, in_flight=running,
                      per_call_s=0.0, accepted=accepted)


def test_a_stream_just_sent_counts_until_a_report_counts_it():
    """Two replicas hold 2 each by their reports; this gateway holds r1's two and has just had one accepted by r2
    (its 3rd), which r2's report does not count yet: r2 holds 3, so the next goes to r1. By the larger of report and
    own streams alone, both were at 2: a coin toss, and a second stream on r2 half the time."""
    unreported = choice.Unreported()
    reports = [report("r1", 2, 2), report("r2", 2, 2)]
    for r in reports:
        unreported.reported(r)
    opened = {"r1": 2, "r2": 1}
    unreported.sent("a", "r2")
    assert unreported.count("a", "r2") == 1  # sent, not accepted yet
    unreported.unsent("a", "r2")
    unreported.accepted("a", "r2", 3)
    assert unreported.count("a", "r2") == 1  # accepted, no report counts it
    assert {choice.fewest_running(reports, opened, random.Random(seed), unreported) for seed in range(20)} == {"r1"}
    assert {choice.fewest_running(reports, opened, random.Random(seed)) for seed in range(20)} == {"r1", "r2"}
    unreported.reported(report("r2", 3, 3))  # its next report counts it: no longer added
    assert unreported.count("a", "r2") == 0


def test_a_report_read_before_the_accept_it_counts_is_not_counted_twice():
    """The replica's report (made after the accept) is read first: its count says it holds the stream."""
    unreported = choice.Unreported()
    unreported.sent("a", "r1")
    unreported.reported(report("r1", 1, 1))
    unreported.unsent("a", "r1")
    unreported.accepted("a", "r1", 1)
    assert unreported.count("a", "r1") == 0


def test_a_report_made_before_the_accept_and_read_after_it_does_not_clear_it():
    unreported = choice.Unreported()
    unreported.reported(report("r1", 4, 4))
    unreported.accepted("a", "r1", 5)
    unreported.reported(report("r1", 4, 4))  # made before the 5th accept: it does not count it
    assert unreported.count("a", "r1") == 1
    unreported.reported(report("r1", 3, 6))  # later: it counts the 5th (and one from another gateway)
    assert unreported.count("a", "r1") == 0


def test_a_replica_that_does_not_count_its_accepts_is_routed_as_before():
    unreported = choice.Unreported()
    unreported.accepted("a", "old", 0)
    unreported.reported(report("old", 2, 0))
    assert unreported.count("a", "old") == 0


def test_a_replica_the_load_board_forgets_is_forgotten_here_too():
    unreported = choice.Unreported()
    board = choice.LoadBoard(clock=lambda: 0.0)
    board.on_forget = unreported.forget
    board.record(report("r1", 1, 1))
    unreported.accepted("a", "r1", 2)
    board.sweep(choice.FORGET_AFTER_S + 10.0)
    assert unreported.count("a", "r1") == 0 and unreported._reported == {} and unreported._uncounted == {}


def test_a_report_of_another_app_naming_the_replica_clears_nothing_of_this_apps_streams():
    """Counts are kept per app: a report that names this replica but comes from another app's subject (so says
    another app, ``Router`` checks) cannot mark this app's streams as counted."""
    unreported = choice.Unreported()
    unreported.accepted("a", "r1", 1)
    other = LoadReport(replica_id="r1", app="b", function="f", version=1, queued=0, in_flight=0, per_call_s=0.0,
                       accepted=1000)
    unreported.reported(other)
    assert unreported.count("a", "r1") == 1
