"""The schedule loop against what goes wrong around it, on a real nats-server: a schedule this control plane cannot
compute (a zone its tzdata lacks, accepted by a newer one) stops no other app's; a new version that changes when a
function ticks does not catch up the old timing's ticks under the new one, and changes nothing before it takes the
calls; a run asked for outside the schedule does not hide the last tick's run, still going, from
``overlap="skip"``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
from support.nats_cluster import NatsCluster
from support.natsconn import connect

from ember._deploy import inspect_app
from ember._loop import run as run_loop
from ember.wire import Deployment, Manifest, Release, TrafficShare, subjects
from ember.wire.atomic import allow_atomic
from ember.wire.callstore import final
from ember.wire.jetstream import ensure_buckets, kv_stream
from ember.wire.schedules import ScheduleSpec, next_tick, state_key
from ember_platform.calls.durable import Calls
from ember_platform.control.schedules import ScheduleLoop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
SOURCE = '''import ember
app = ember.App({app!r})


@app.function(schedule={schedule})
def beat() -> None: ...
'''


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with NatsCluster(tmp_path_factory.mktemp("nats"), size=1) as cluster:
        yield cluster.url


def _deployment(tmp_path: Path, app: str, schedule: str, version: int = 1) -> Deployment:
    source = tmp_path / f"{app.replace('-', '_')}_v{version}.py"
    source.write_text(SOURCE.format(app=app, schedule=schedule))
    return Deployment(app=app, version=version, bundle_sha256="0" * 64, created_at=time.time(), born_at=1.0,
                      manifest=inspect_app(source))


def _with_schedule(dep: Deployment, spec: ScheduleSpec) -> Deployment:
    """``dep`` with its function's schedule replaced, as a control plane with other zone data accepted it."""
    service = dep.manifest.services[0]
    fn = msgspec.structs.replace(service.functions[0], schedule=spec)
    manifest: Manifest = msgspec.structs.replace(dep.manifest, services=[msgspec.structs.replace(service,
                                                                                                  functions=[fn])])
    return msgspec.structs.replace(dep, manifest=manifest)


class _Loop:
    """A schedule loop of its own over ``deployments`` (a mirror's ``items`` and ``generation``)."""

    def __init__(self, url: str, deployments: dict[str, Deployment]) -> None:
        self.url, self.mirror = url, SimpleNamespace(items=deployments, generation=1)

    async def __aenter__(self) -> _Loop:
        self.nc = await connect(self.url)
        stores = await ensure_buckets(self.nc.jetstream())
        for stream in (kv_stream(subjects.CALLS_BUCKET), subjects.CALLS_STREAM):
            await allow_atomic(self.nc.jetstream(), stream)
        self.calls = Calls(self.nc, stores, 30.0)
        self.loop = ScheduleLoop(self.nc.jetstream(), self.calls, self.mirror, active=lambda: False)
        await self.loop.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.loop.stop()
        await self.nc.close()

    def deploy(self, dep: Deployment) -> None:
        self.mirror.items = {**self.mirror.items, dep.app: dep}
        self.mirror.generation += 1

    def state(self, app: str):  # type: ignore[no-untyped-def]
        return self.loop.states.items.get(state_key(app, "beat"))

    async def finish(self, app: str, call_id: str) -> None:
        record = await self.calls.store.get(app, call_id)
        assert record is not None
        await self.calls.store.finish(final(record, "succeeded"))  # as its replica would: the run ended
        await asyncio.sleep(0.3)  # the watch tells the loop


def test_a_schedule_this_control_plane_cannot_compute_stops_no_other_apps(nats_url, tmp_path):
    good = _deployment(tmp_path, "faults-good", "ember.Period(seconds=1, overlap='allow')")
    bad = _with_schedule(_deployment(tmp_path, "faults-bad", "ember.Cron('0 6 * * *')"),
                         ScheduleSpec(cron="0 6 * * *", timezone="Mars/Olympus"))

    async def scenario() -> tuple[int, object, list[str]]:
        async with _Loop(nats_url, {good.app: good, bad.app: bad}) as it:
            now = time.time()
            await it.loop.tick(now)  # both first seen
            for n in range(1, 4):
                await it.loop.tick(now + n)
            views = await it.loop.views(lambda app: True)
            return it.state(good.app).runs, it.state(bad.app), [f"{v.app}:{v.next_run > 0}" for v in views]

    runs, bad_state, views = run_loop(scenario())
    assert runs >= 2  # its ticks fired, pass after pass, beside the schedule that raised
    assert bad_state is not None and bad_state.runs == 0
    assert views == ["faults-bad:False", "faults-good:True"]  # the listing answers (no next run it can compute)


def test_a_new_timing_does_not_catch_up_the_old_ones_ticks(nats_url, tmp_path):
    daily = _deployment(tmp_path, "faults-retimed", "ember.Cron('0 6 * * *', catch_up='all')")
    every_second = _deployment(tmp_path, "faults-retimed", "ember.Period(seconds=1, catch_up='all', overlap='allow')",
                               version=2)

    async def scenario() -> tuple[int, int]:
        async with _Loop(nats_url, {daily.app: daily}) as it:
            now = time.time()
            await it.loop.tick(now)  # first seen under the daily cron
            it.deploy(every_second)
            await it.loop.tick(now + 60)  # a minute later, the new version ticks every second
            at_push = it.state(daily.app).runs
            await it.loop.tick(next_tick(it.loop.find(daily.app, "beat")[2], now + 60) + 0.05)  # its next tick alone
            return at_push, it.state(daily.app).runs

    at_push, after = run_loop(scenario())
    assert at_push == 0  # before: the 60 ticks since the cron's last one, measured under the new period, all ran
    assert after == 1  # and from then on it ticks as the new version says


def test_a_run_asked_for_does_not_hide_the_last_ticks_run_from_overlap_skip(nats_url, tmp_path):
    dep = _deployment(tmp_path, "faults-overlap", "ember.Period(seconds=1, overlap='skip')")

    async def scenario() -> str:
        async with _Loop(nats_url, {dep.app: dep}) as it:
            now = time.time()
            await it.loop.tick(now)
            t1 = next_tick(it.loop.find(dep.app, "beat")[2], now)
            await it.loop.tick(t1 + 0.05)  # the tick's run: it goes on
            assert it.state(dep.app).last_status == "fired"
            asked = await it.loop.run_now(dep.app, "beat")
            await it.finish(dep.app, asked)  # the run asked for ended; the tick's has not
            await it.loop.tick(t1 + 1.05)
            return it.state(dep.app).last_status

    assert run_loop(scenario()) == "skipped"  # before: "fired", beside the tick's run still going


def test_a_schedule_follows_the_version_that_takes_the_calls_not_the_one_rolled_out(nats_url, tmp_path):
    """A push whose new version drops a schedule (or changes it) changes nothing until that version takes the calls:
    before, the version still starting (one that may never become ready) stopped the serving version's ticks."""
    v1 = _deployment(tmp_path, "faults-rollout", "ember.Period(seconds=1, overlap='allow')")
    plain = _deployment(tmp_path, "faults-rollout", "None", version=2)
    rolling = msgspec.structs.replace(plain, releases=[Release(version=1, bundle_sha256=v1.bundle_sha256,
                                                               manifest=v1.manifest, created_at=v1.created_at)],
                                      traffic=[TrafficShare(version=1, percent=100)])

    async def scenario() -> tuple[int, int, bool]:
        async with _Loop(nats_url, {v1.app: v1}) as it:
            now = time.time()
            await it.loop.tick(now)
            it.deploy(rolling)  # version 2 starts; version 1 still takes every call
            for n in range(1, 3):
                await it.loop.tick(now + n + 0.05)
            while_rolling = it.state(v1.app).runs
            it.deploy(msgspec.structs.replace(rolling, traffic=[TrafficShare(version=2, percent=100)]))
            await it.loop.tick(now + 3.05)
            await it.loop.tick(now + 4.05)
            runs = it.state(v1.app).runs if it.state(v1.app) is not None else -1
            return while_rolling, runs, it.state(v1.app) is None

    while_rolling, _runs, forgotten = run_loop(scenario())
    assert while_rolling == 2  # version 1's schedule ticked on while version 2 started
    assert forgotten  # once version 2 took the calls, its schedule (none) is the app's
