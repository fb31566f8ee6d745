"""Least-loaded routing: power of two choices over fresh load reports (``calls.choice``), and the router around it."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from ember._errors import UnavailableError
from ember.wire import Invocation, LoadReport, encoder, subjects
from ember_platform.calls import choice
from ember_platform.calls.choice import LoadBoard, choose
from ember_platform.calls.router import Router


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def board(*reports: tuple[LoadReport, float]) -> LoadBoard:
    """A board that received each report ``age_s`` seconds ago."""
    clock = Clock()
    loads = LoadBoard(clock=clock)
    for report, age_s in sorted(reports, key=lambda r: -r[1]):
        clock.now = 100.0 - age_s
        loads.record(report)
    clock.now = 100.0
    return loads


def load(replica: str, queued: int, in_flight: int = 0, per_call_s: float = 0.0) -> LoadReport:
    return LoadReport(replica_id=replica, app="a", function="f", version=1, queued=queued, in_flight=in_flight,
                      per_call_s=per_call_s)


def test_the_less_loaded_of_two_replicas_is_chosen():
    reports = [load("busy", 9, 8), load("idle", 0)]
    assert {choose(reports, {}) for _ in range(20)} == {"idle"}


def test_calls_sent_since_the_report_count_as_load():
    reports = [load("x", 0), load("y", 0)]
    assert {choose(reports, {"x": 5}) for _ in range(20)} == {"y"}


def test_estimated_wait_uses_the_cost_per_call_when_known():
    assert choose([load("slow", 1, per_call_s=0.100), load("fast", 5, per_call_s=0.001)], {}) == "fast"


def test_a_replica_without_a_cost_estimate_is_compared_by_counts():
    assert choose([load("new", 0), load("old", 6, per_call_s=0.001)], {}) == "new"


def test_one_candidate_is_taken_and_none_means_the_queue_group():
    assert choose([load("x", 50)], {"x": 9}) == "x"
    assert choose([], {}) is None


def test_a_seeded_generator_makes_the_choice_repeatable():
    reports = [load(f"r{i}", i % 3) for i in range(8)]
    assert [choose(reports, {}, random.Random(7)) for _ in range(5)] == \
        [choose(reports, {}, random.Random(7)) for _ in range(5)]


def test_only_fresh_reports_of_the_function_version_are_candidates():
    loads = board((load("x", 0), 0.0), (load("stale", 0), 5.0))
    assert [r.replica_id for r in loads.fresh("a", "f", 1)] == ["x"]
    assert loads.fresh("a", "f", 2) == []  # another version
    assert loads.fresh("a", "g", 1) == []


def router(alive: set[str], *reports: LoadReport) -> Router:
    r = Router(nc=None, replica_alive=lambda rid: rid in alive)  # type: ignore[arg-type]
    for report in reports:
        asyncio.run(r._on_report(_Msg(encoder.encode(report), subjects.stats(report.app, report.function))))  # type: ignore[arg-type]
    return r


def test_the_router_skips_dead_and_excluded_replicas():
    assert router(set(), load("x", 0)).choose("a", "f", 1, set()) is None  # not alive: the queue group
    assert router({"x", "y"}, load("x", 0), load("y", 7)).choose("a", "f", 1, {"x"}) == "y"
    assert router({"x"}, load("x", 0)).choose("a", "f", 2, set()) is None  # another version


class _Msg:
    def __init__(self, data: bytes, subject: str) -> None:
        self.data = data
        self.subject = subject


def test_a_report_counts_only_for_the_app_whose_subject_it_came_on():
    """A replica may publish only on its own app's stats subjects (its NATS permissions); what its report says of
    app and function must match that subject, or another app's replica could speak for this app's replicas."""
    r = Router(nc=None, replica_alive=lambda rid: True)  # type: ignore[arg-type]
    forged = load("x", 0)  # of app "a", sent on app "b"'s subject
    asyncio.run(r._on_report(_Msg(encoder.encode(forged), subjects.stats("b", "f"))))  # type: ignore[arg-type]
    assert r.loads.fresh("a", "f", 1) == []
    asyncio.run(r._on_report(_Msg(encoder.encode(forged), subjects.stats("a", "g"))))  # type: ignore[arg-type]
    assert r.loads.fresh("a", "f", 1) == []  # another function's subject
    asyncio.run(r._on_report(_Msg(encoder.encode(forged), subjects.stats("a", "f"))))  # type: ignore[arg-type]
    assert r.loads.fresh("a", "f", 1) == [forged]


def test_a_report_naming_another_apps_replica_draws_no_call_there():
    """A replica of app "a" may publish on a's stats subject, its report naming any replica id: one naming app b's
    replica drew a's calls to b's replica (its function of the same name ran a's input). Only the app's own
    replicas, as the registry knows them when a call is routed, are chosen (a report may come before the status)."""
    owners = {"mine": "a", "theirs": "b"}
    r = Router(nc=None, replica_alive=lambda rid: rid in owners,  # type: ignore[arg-type]
               replica_of=lambda rid, app: owners.get(rid) == app)
    for replica, queued in (("theirs", 0), ("unknown", 0), ("mine", 5)):  # the forged ones look idle
        asyncio.run(r._on_report(_Msg(encoder.encode(load(replica, queued)), subjects.stats("a", "f"))))  # type: ignore[arg-type]
    assert {r.choose("a", "f", 1, set()) for _ in range(20)} == {"mine"}
    assert r.choose_stream("a", "f", 1, set()) == "mine"


def cost(replica: str, function: str, per_call_s: float, version: int = 1) -> LoadReport:
    return LoadReport(replica_id=replica, app="a", function=function, version=version, queued=0, in_flight=0,
                      per_call_s=per_call_s)


def test_capacity_is_one_over_the_median_fresh_cost_per_call_of_the_service():
    loads = board((cost("x", "M.predict", 0.010), 0.0), (cost("y", "M.predict", 0.020), 0.0),
                  (cost("z", "M.embed", 0.040, version=2), 0.0),  # any function and version of the service
                  (cost("old", "M.predict", 0.001), 5.0),  # stale
                  (cost("new", "M.predict", 0.0), 0.0),  # not measured yet
                  (cost("w", "other", 0.001), 0.0))  # another service
    assert loads.capacity("a", "M") == 1 / 0.020
    assert loads.capacity("a", "other") == 1 / 0.001
    assert loads.capacity("a", "nothing") is None
    assert board((cost("old", "M.predict", 0.01), 5.0)).capacity("a", "M") is None


def test_every_call_received_is_counted_once_per_service_whatever_its_fate():
    """Calls to a class's methods count for the class; a call that fails (here: NATS is down) counts too."""

    class FailingNats:
        max_payload = 1024 * 1024

        def new_inbox(self) -> str:
            return "_INBOX.x"

        async def publish(self, *args: object, **kwargs: object) -> None:
            raise ConnectionError("down")

    async def scenario() -> None:
        r = Router(nc=FailingNats(), replica_alive=lambda rid: False)  # type: ignore[arg-type]
        for function in ("M.predict", "M.embed", "f"):
            with pytest.raises(UnavailableError, match=r"could not send the call to a\..*: down"):
                await r.call("a", function, 1, b"{}", call_id=function, deadline=time.time() + 10)
        assert r.received == {("a", "M"): 2, ("a", "f"): 1}
        assert not r.in_flight and r.idle

    asyncio.run(scenario())


def test_a_pending_call_gets_its_messages_in_order_or_times_out():
    from ember_platform.calls.router import _Pending

    async def scenario() -> list[object]:
        pending = _Pending("a.f", Invocation(call_id="c1", function="f", deadline=time.time() + 10))
        pending.deliver("early")  # type: ignore[arg-type]  # before anyone waits: kept
        seen: list[object] = [await pending.next(1.0)]
        asyncio.get_running_loop().call_soon(pending.deliver, "late")
        seen.append(await pending.next(1.0))  # delivered while waiting
        try:
            await pending.next(0.01)
        except TimeoutError:
            seen.append("timeout")
        return seen

    assert asyncio.run(scenario()) == ["early", "late", "timeout"]


def test_replicas_that_stopped_reporting_are_forgotten_and_their_versions_too():
    clock = Clock()
    loads = LoadBoard(clock=clock)
    for i in range(50):  # replicas of version 1 that came and went (autoscaling, a rollout)
        loads.record(LoadReport(replica_id=f"old{i}", app="a", function="f", version=1, queued=0, in_flight=0,
                                per_call_s=0.001, slots=1))
    clock.now += choice.IDLE_FRESH_S + choice.FORGET_AFTER_S
    live = LoadReport(replica_id="new", app="a", function="f", version=2, queued=1, in_flight=0, per_call_s=0.001,
                      slots=1)
    for _ in range(choice.SWEEP_EVERY):  # the live replica's reports, until a sweep
        loads.record(live)
    assert loads.fresh("a", "f", 1) == [] and loads.fresh("a", "f", 2) == [live]
    assert list(loads._reports) == [("a", "f", 2)] and loads._services == {("a", "f"): {("a", "f", 2)}}
    assert loads.capacity("a", "f") == 1000.0


def test_a_new_stream_goes_to_the_replica_with_the_fewest_running_sequences():
    reports = [load("r1", 0, 5), load("r2", 1, 1), load("r3", 0, 4)]
    assert {choice.fewest_running(reports, {}, random.Random(seed)) for seed in range(20)} == {"r2"}
    # streams this gateway opened since the reports count too: r2 holds 3 now, r3's 4 is still more
    assert choice.fewest_running(reports, {"r2": 3}) == "r2"
    assert choice.fewest_running(reports, {"r2": 6}) == "r3"
    assert choice.fewest_running([], {}) is None


def test_ties_among_the_least_loaded_are_broken_at_random():
    reports = [load("r1", 0, 2), load("r2", 0, 2), load("r3", 0, 9)]
    assert {choice.fewest_running(reports, {}, random.Random(seed)) for seed in range(40)} == {"r1", "r2"}


def test_a_burst_of_streams_is_spread_by_the_streams_the_gateway_holds_open():
    """Reports lag a burst: 8 streams opened in a row, counted as they go, land 4 and 4 on two idle replicas."""
    reports = [load("r1", 0, 0), load("r2", 0, 0)]
    opened: dict[str, int] = {}
    for _ in range(8):
        chosen = choice.fewest_running(reports, opened)
        assert chosen is not None
        opened[chosen] = opened.get(chosen, 0) + 1
    assert opened == {"r1": 4, "r2": 4}
