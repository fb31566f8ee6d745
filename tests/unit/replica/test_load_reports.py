"""A replica's load reports: a changed one goes at once, an unchanged one again only every ``IDLE_REPORT_S`` (an
idle replica sends a twentieth of a busy one's messages, still fresh for the router, and does not wake in between
unless a call is queued)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import msgspec

from ember.wire import LoadReport
from ember_platform.calls.choice import IDLE_FRESH_S, REPORT_FRESH_S, LoadBoard
from ember_runtime.batching.batcher import Batcher, Call
from ember_runtime.replica import process
from ember_runtime.replica.process import IDLE_REPORT_S, LOAD_REPORT_S, report_due
from ember_runtime.replica.reports import BUSY_REPORT_S

IDLE = LoadReport(replica_id="r1", app="a", function="f", version=1, queued=0, in_flight=0, per_call_s=0.001, slots=1)


def test_the_first_report_is_due():
    assert report_due(IDLE, None, 10.0)


def test_an_unchanged_report_waits_for_the_idle_period():
    assert not report_due(IDLE, (IDLE, 10.0), 10.0 + LOAD_REPORT_S)
    assert not report_due(IDLE, (IDLE, 10.0), 10.0 + IDLE_REPORT_S - 0.01)
    assert report_due(IDLE, (IDLE, 10.0), 10.0 + IDLE_REPORT_S)


def test_a_busy_replicas_unchanged_report_keeps_it_fresh_for_the_router():
    """Long streams hold a replica's load still: its unchanged report must come again before the router's
    ``REPORT_FRESH_S`` runs out, or the replica drops out of the routing between two reports."""
    busy = msgspec.structs.replace(IDLE, in_flight=2)
    assert not report_due(busy, (busy, 10.0), 10.0 + LOAD_REPORT_S)
    assert report_due(busy, (busy, 10.0), 10.0 + BUSY_REPORT_S)
    assert BUSY_REPORT_S + LOAD_REPORT_S < REPORT_FRESH_S
    now = [100.0]
    board = LoadBoard(clock=lambda: now[0])
    board.record(busy)
    for _ in range(10):  # the report every BUSY_REPORT_S, each a loop pass late at worst
        now[0] += BUSY_REPORT_S + LOAD_REPORT_S
        assert [r.replica_id for r in board.fresh("a", "f", 1)] == ["r1"]
        board.record(busy)


def test_a_changed_report_goes_at_once():
    for change in ({"queued": 1}, {"in_flight": 1}, {"per_call_s": 0.002}):
        assert report_due(msgspec.structs.replace(IDLE, **change), (IDLE, 10.0), 10.0 + LOAD_REPORT_S)


def test_an_idle_replica_stays_fresh_for_the_router():
    assert IDLE_REPORT_S + LOAD_REPORT_S < IDLE_FRESH_S / 2  # two reports may be late before the router forgets it
    now = [100.0]
    board = LoadBoard(clock=lambda: now[0])
    board.record(IDLE)
    board.record(msgspec.structs.replace(IDLE, replica_id="r2", in_flight=3))
    now[0] += REPORT_FRESH_S + 0.01  # a busy replica's report is stale after REPORT_FRESH_S
    assert [r.replica_id for r in board.fresh("a", "f", 1)] == ["r1"]
    assert board.capacity("a", "f") == 1000.0
    now[0] += IDLE_REPORT_S
    assert [r.replica_id for r in board.fresh("a", "f", 1)] == ["r1"]
    now[0] = 100.0 + IDLE_FRESH_S
    assert board.fresh("a", "f", 1) == []
    assert board.capacity("a", "f") is None


def test_an_idle_replica_reports_as_soon_as_a_call_is_queued(monkeypatch):
    monkeypatch.setattr(process, "IDLE_REPORT_S", 30.0)  # woken by nothing else, the wait would outlast the test

    async def scenario() -> None:
        replica = SimpleNamespace(stop=asyncio.Event(), activity=asyncio.Event())
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(lambda xs: xs, max_size=1, window_s=0.0, executor=pool)
            batcher.on_submit = replica.activity.set
            waiting = asyncio.create_task(process.Replica._next_report(replica, idle=True))  # type: ignore[arg-type]
            await asyncio.sleep(0)
            assert not waiting.done()
            batcher.submit(Call(1, time.time() + 60, _noop, "c1"))
            await asyncio.wait_for(waiting, 5)

    asyncio.run(scenario())


def test_an_idle_replica_with_no_calls_waits_for_the_idle_period(monkeypatch):
    monkeypatch.setattr(process, "IDLE_REPORT_S", 0.05)

    async def scenario() -> None:
        replica = SimpleNamespace(stop=asyncio.Event(), activity=asyncio.Event())
        await asyncio.wait_for(process.Replica._next_report(replica, idle=True), 5)  # type: ignore[arg-type]
        assert not replica.activity.is_set()

    asyncio.run(scenario())


async def _noop(*_: object) -> None:
    return None
