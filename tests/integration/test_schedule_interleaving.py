"""The schedule loop against a pause that lands while a tick of the same function is being queued, on a
real nats-server with Ember's buckets: the loop's state, made before the pause, must not overwrite it (its
compare-and-set is against the revision it read, not its mirror's latest, which the API's write updates at once).
And the schedule listing reads a last run's record until it is final, then no more.

The interleaving is forced, not waited for: the calls' ``submit_many`` (the real one, to the real durable queue) is held
at a gate while the API's pause is written. The deployments are given in memory, as ``bench/schedules.py`` does: a
whole platform's own loop, holding the lease, would forget the keys of functions it has not deployed."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.nats_cluster import NatsCluster
from support.natsconn import connect

from ember._deploy import inspect_app
from ember._loop import run as run_loop
from ember.wire import Deployment, subjects
from ember.wire.atomic import allow_atomic
from ember.wire.callstore import final
from ember.wire.jetstream import ensure_buckets, kv_stream
from ember.wire.schedules import next_tick, state_key
from ember_platform.calls.durable import Calls
from ember_platform.control.schedules import ScheduleLoop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
APP, FN = "interleaved", "beat"


class GatedCalls(Calls):
    """The platform's calls, the loop's submits held until ``gate`` opens (``entered`` says one is held)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate, self.entered = asyncio.Event(), asyncio.Event()
        self.gate.set()

    async def submit_many(self, *args: Any, **kwargs: Any) -> Any:  # the loop's ticks
        self.entered.set()
        await self.gate.wait()
        return await super().submit_many(*args, **kwargs)


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory):
    with NatsCluster(tmp_path_factory.mktemp("nats"), size=1) as cluster:
        yield cluster.url


def _deployments(tmp_path: Path) -> SimpleNamespace:
    source = tmp_path / "interleaved.py"
    source.write_text(f"import ember\napp = ember.App({APP!r})\n\n"
                      f"@app.function(schedule=ember.Period(seconds=1, overlap='allow'))\ndef {FN}() -> None: ...\n")
    dep = Deployment(app=APP, version=1, bundle_sha256="0" * 64, created_at=time.time(), manifest=inspect_app(source))
    return SimpleNamespace(items={APP: dep}, generation=1)


async def _loop(url: str, tmp_path: Path) -> tuple[Any, GatedCalls, ScheduleLoop]:
    nc = await connect(url)
    stores = await ensure_buckets(nc.jetstream())
    for stream in (kv_stream(subjects.CALLS_BUCKET), subjects.CALLS_STREAM):  # as the control plane does
        await allow_atomic(nc.jetstream(), stream)
    calls = GatedCalls(nc, stores, 30.0)
    loop = ScheduleLoop(nc.jetstream(), calls, _deployments(tmp_path), active=lambda: False)  # type: ignore[arg-type]
    await loop.start()  # its own passes wait for the lease (never): the test runs each pass itself
    for key in list(loop.states.items if loop.states else ()):  # a key of an earlier test: started afresh
        await loop.kv.delete(key)  # type: ignore[union-attr]
        loop.states.record(key, None, loop.states.revision(key) + 1)  # type: ignore[union-attr]
    return nc, calls, loop


async def _paused_across_a_tick(url: str, tmp_path: Path) -> tuple[bool, bool, bool]:
    """A pause written while a tick's call is held at the gate: (paused in the loop's mirror, paused in the bucket,
    paused in the bucket after one more pass)."""
    nc, calls, loop = await _loop(url, tmp_path)
    try:
        now = time.time()
        await loop.tick(now)  # first seen: its state is created, it runs from its next tick
        key = state_key(APP, FN)
        assert loop.states is not None and key in loop.states.items
        tick = next_tick(loop.find(APP, FN)[2], now)
        calls.gate.clear()
        handled = asyncio.create_task(loop.tick(tick + 0.01))
        await asyncio.wait_for(calls.entered.wait(), 10)  # the tick's call is being queued
        await loop.set_paused(APP, FN, True)  # the API's write, in the loop's mirror at once
        calls.gate.set()
        await asyncio.wait_for(handled, 10)
        in_mirror = loop.states.items[key].paused
        stored = await _stored_paused(loop, key)
        await loop.tick(math.floor(tick) + 1.02)  # the key was written meanwhile: looked at again
        return in_mirror, stored, await _stored_paused(loop, key)
    finally:
        await loop.stop()
        await nc.close()


async def _stored_paused(loop: ScheduleLoop, key: str) -> bool:
    state, _revision = await loop._read(key)
    return state.paused


def test_a_pause_written_while_a_tick_is_queued_is_not_overwritten_by_the_loop(nats_url, tmp_path):
    assert run_loop(_paused_across_a_tick(nats_url, tmp_path)) == (True, True, True)


async def _listings(url: str, tmp_path: Path) -> tuple[list[str], int, int]:
    """The last run's status in three listings (queued, then final twice), and the records read by the second and
    the third."""
    nc, calls, loop = await _loop(url, tmp_path)
    reads = 0
    real_get = calls.store.get

    async def counted_get(app: str, call_id: str) -> Any:
        nonlocal reads
        reads += 1
        return await real_get(app, call_id)

    calls.store.get = counted_get  # type: ignore[method-assign]
    try:
        call_id = await loop.run_now(APP, FN)
        statuses = [(await loop.views(lambda _app: True))[0].last_call_status]
        record = await real_get(APP, call_id)
        assert record is not None
        await calls.store.finish(final(record, "succeeded"))  # as its replica would
        before = reads
        statuses.append((await loop.views(lambda _app: True))[0].last_call_status)
        second = reads - before
        statuses.append((await loop.views(lambda _app: True))[0].last_call_status)
        return statuses, second, reads - before - second
    finally:
        await loop.stop()
        await nc.close()


def test_the_listing_reads_a_last_run_until_it_is_final_and_then_no_more(nats_url, tmp_path):
    statuses, second, third = run_loop(_listings(nats_url, tmp_path))
    assert statuses == ["queued", "succeeded", "succeeded"]
    assert (second, third) == (1, 0)
