"""A tick fired again, after its state could not be written (a KV timeout, a pass that raised), finds its own call
there already; when that call has ended, the next ticks run. Before, the loop took the call found for one about to
wait, and no message of the watch ever said it ended: with overlap="skip" every later tick was skipped, for good."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.nats_cluster import NatsCluster
from support.natsconn import connect

from ember._deploy import inspect_app
from ember._loop import run as run_loop
from ember.wire import Deployment, subjects
from ember.wire.atomic import allow_atomic
from ember.wire.callstore import final
from ember.wire.jetstream import ensure_buckets, kv_stream
from ember.wire.schedules import next_tick, state_key, tick_call_id
from ember_platform.calls.durable import Calls
from ember_platform.control import schedules
from ember_platform.control.schedules import ScheduleLoop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
APP, FN = "refired", "beat"
SOURCE = f'''import ember
app = ember.App({APP!r})


@app.function(schedule=ember.Period(seconds=1, overlap="skip"))
def {FN}() -> None: ...
'''


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory):
    with NatsCluster(tmp_path_factory.mktemp("nats"), size=1) as cluster:
        yield cluster.url


async def _until(t: float) -> None:
    while time.time() < t:
        await asyncio.sleep(0.01)


async def _later_ticks(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    source = tmp_path / f"{APP}.py"
    source.write_text(SOURCE)
    dep = Deployment(app=APP, version=1, bundle_sha256="0" * 64, created_at=time.time(), manifest=inspect_app(source))
    nc = await connect(url)
    stores = await ensure_buckets(nc.jetstream())
    for stream in (kv_stream(subjects.CALLS_BUCKET), subjects.CALLS_STREAM):
        await allow_atomic(nc.jetstream(), stream)
    calls = Calls(nc, stores, 30.0)
    loop = ScheduleLoop(nc.jetstream(), calls, SimpleNamespace(items={APP: dep}, generation=1), active=lambda: False)
    await loop.start()
    try:
        now = time.time()
        await loop.tick(now)  # first seen
        t1 = next_tick(loop.find(APP, FN)[2], now)
        await _until(t1 + 0.05)
        with monkeypatch.context() as patched:
            async def not_written(js, writes, *args, **kwargs):  # the state write times out once
                return [False] * len(writes)

            patched.setattr(schedules, "write_states", not_written)
            await loop.tick(t1 + 0.05)  # t1 fires; its state is not written
        first = tick_call_id(APP, FN, t1)
        record = await calls.store.get(APP, first)
        assert record is not None
        await calls.store.finish(final(record, "succeeded"))  # as its replica would: the run ended
        await asyncio.sleep(0.3)  # the watch tells the loop
        await loop.tick(t1 + 0.4)  # handled again: t1 fires again, and finds its call (ended)
        statuses = []
        for n in range(1, 4):
            await _until(t1 + n + 0.05)
            await loop.tick(t1 + n + 0.05)
            state = loop.states.items[state_key(APP, FN)]
            statuses.append(state.last_status)
            if state.last_call_id != first:  # each later tick's call ends at once, as the first did
                record = await calls.store.get(APP, state.last_call_id)
                assert record is not None
                await calls.store.finish(final(record, "succeeded"))
                await asyncio.sleep(0.3)
        return statuses
    finally:
        await loop.stop()
        await nc.close()


def test_a_tick_fired_again_after_its_run_ended_lets_the_next_ticks_run(nats_url, tmp_path, monkeypatch):
    assert run_loop(_later_ticks(nats_url, tmp_path, monkeypatch)) == ["fired"] * 3
