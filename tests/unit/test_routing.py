"""Least-loaded routing: power of two choices over fresh load reports (the policy part of the router)."""

from __future__ import annotations

import asyncio
import time

import pytest

from ember._errors import UnavailableError
from ember.wire import Invocation, LoadReport, encoder
from ember_platform.calls.router import Router


def router(alive: set[str], *reports: LoadReport, age_s: float = 0.0) -> Router:
    r = Router(nc=None, replica_alive=lambda rid: rid in alive)  # type: ignore[arg-type]
    for report in reports:
        r._reports.setdefault((report.app, report.function, report.version), {})[report.replica_id] = (
            time.monotonic() - age_s, report)
    return r


def load(replica: str, queued: int, in_flight: int = 0, per_call_s: float = 0.0) -> LoadReport:
    return LoadReport(replica_id=replica, app="a", function="f", version=1, queued=queued, in_flight=in_flight,
                      per_call_s=per_call_s)


def test_the_less_loaded_of_two_replicas_is_chosen():
    r = router({"busy", "idle"}, load("busy", 9, 8), load("idle", 0))
    assert {r.choose("a", "f", 1, set()) for _ in range(20)} == {"idle"}


def test_calls_sent_since_the_report_count_as_load():
    r = router({"x", "y"}, load("x", 0), load("y", 0))
    r._sent["x"] = 5
    assert {r.choose("a", "f", 1, set()) for _ in range(20)} == {"y"}


def test_estimated_wait_uses_the_cost_per_call_when_known():
    r = router({"slow", "fast"}, load("slow", 1, per_call_s=0.100), load("fast", 5, per_call_s=0.001))
    assert r.choose("a", "f", 1, set()) == "fast"


def test_stale_dead_or_excluded_replicas_are_not_chosen():
    assert router({"x"}, load("x", 0), age_s=5.0).choose("a", "f", 1, set()) is None  # stale: use the queue group
    assert router(set(), load("x", 0)).choose("a", "f", 1, set()) is None  # not alive
    assert router({"x", "y"}, load("x", 0), load("y", 7)).choose("a", "f", 1, {"x"}) == "y"
    assert router({"x"}, load("x", 0)).choose("a", "f", 2, set()) is None  # another version


def test_a_replica_without_a_cost_estimate_is_compared_by_counts():
    r = router({"new", "old"}, load("new", 0), load("old", 6, per_call_s=0.001))
    assert r.choose("a", "f", 1, set()) == "new"


def router_with(*reports: tuple[LoadReport, float]) -> Router:
    """A router that received each report ``age_s`` ago, through its report handler."""
    r = router(set())
    for report, age_s in reports:
        asyncio.run(r._on_report(_Msg(encoder.encode(report))))  # type: ignore[arg-type]
        key = (report.app, report.function, report.version)
        at, kept = r._reports[key][report.replica_id]
        r._reports[key][report.replica_id] = (at - age_s, kept)
    return r


class _Msg:
    def __init__(self, data: bytes) -> None:
        self.data = data


def cost(replica: str, function: str, per_call_s: float, version: int = 1) -> LoadReport:
    return LoadReport(replica_id=replica, app="a", function=function, version=version, queued=0, in_flight=0,
                      per_call_s=per_call_s)


def test_capacity_is_one_over_the_median_fresh_cost_per_call_of_the_service():
    r = router_with((cost("x", "M.predict", 0.010), 0.0), (cost("y", "M.predict", 0.020), 0.0),
                    (cost("z", "M.embed", 0.040, version=2), 0.0),  # any function and version of the service
                    (cost("old", "M.predict", 0.001), 5.0),  # stale
                    (cost("new", "M.predict", 0.0), 0.0),  # not measured yet
                    (cost("w", "other", 0.001), 0.0))  # another service
    assert r.capacity("a", "M") == 1 / 0.020
    assert r.capacity("a", "other") == 1 / 0.001
    assert r.capacity("a", "nothing") is None
    assert router_with((cost("old", "M.predict", 0.01), 5.0)).capacity("a", "M") is None


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
        assert not r.in_flight and not r._frames

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
