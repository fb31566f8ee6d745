"""The schedule loop: each due tick of a scheduled function (``ember.Period``, ``ember.Cron``) queued once.

Only the control plane holding the control lease (``lease``) fires ticks. A tick is submitted on the function's
durable queue as a spawned call (a record, logs, retries, dead letters), under a call id and a ``Nats-Msg-Id``
derived from ``<app>.<function>.<tick ms>`` (``ember.wire.schedules``): a tick submitted again by a control plane
that took over, or by a second one that believed it held the lease, is recorded and stored once (JetStream's
duplicate window, ``DUPLICATE_WINDOW_S``, and the record's ``create``).

What was done with each function's ticks is kept in the KV bucket ``ember_schedules``, key ``<app>.<function>``
(the key's first token is the app that owns it; the value is a ``ScheduleState``). Only control planes reach it:
the NATS permissions of replicas and node agents (``natsauth.permissions``) are allow-lists that name no subject
of this bucket. A control plane that takes over reads the last tick handled there, so that no tick is skipped or
repeated across a restart; the ticks missed meanwhile follow the function's ``catch_up``. Writes are
compare-and-set: a pause or resume from any control plane's API is never lost under the loop's write (the loop
reads the state again; firing a tick twice is harmless, see above). A new version keeps its function's key; the
key of a function that is no longer deployed (its app deleted, the function removed) is deleted, and no tick of it
fires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from nats.errors import Error as NatsError
from nats.js.api import StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.errors import NotFoundError as JsNotFound
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry, Counter, Histogram

from ember._errors import ConflictError, EmberError, NotFoundError
from ember.wire import FINAL_STATUSES, Deployment, encoder, subjects
from ember.wire.jetstream import KVMirror, js_replicas
from ember.wire.schedules import (
    MAX_CATCH_UP,
    ScheduleSpec,
    ScheduleState,
    ScheduleView,
    describe,
    due,
    next_tick,
    state_key,
    tick_call_id,
    tick_msg_id,
)
from ember_platform.calls.durable import Calls

log = logging.getLogger("ember.schedules")
_state_decoder = msgspec.json.Decoder(ScheduleState)
MAX_WAIT_S = 0.25  # the loop looks at least this often (new deployments, a pause, the lease)
FIRE_CONCURRENCY = 128  # ticks submitted at once (each is two JetStream round trips, then a KV write)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
STATUSES = ("fired", "skipped", "missed", "paused", "queued", "failed", "run")


class ScheduleMetrics:
    """``ember_schedule_runs_total{app,status}`` and ``ember_schedule_lag_seconds{app}`` (tick time to queued)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.runs = Counter("ember_schedule_runs", "Scheduled ticks by what became of them: fired, skipped (the run "
                            "before still ran), missed (catch_up), paused, queued (overlap='queue'), failed (could "
                            "not be queued), run (asked for).", ("app", "status"), registry=self.registry)
        self.lag = Histogram("ember_schedule_lag_seconds", "Time from a tick to its call queued.", ("app",),
                             buckets=LAG_BUCKETS, registry=self.registry)


Scheduled = tuple[Deployment, str, ScheduleSpec]  # the deployment, the function, its schedule


class ScheduleLoop:
    def __init__(self, js: Any, calls: Calls, deployments: KVMirror[Deployment], active: Callable[[], bool]) -> None:
        self._js = js
        self._calls = calls
        self._deployments = deployments
        self._scheduled: tuple[int, list[Scheduled]] = (-1, [])  # the scheduled functions, as of a generation
        self._active = active
        self.metrics = ScheduleMetrics()
        self.kv: KeyValue | None = None
        self.states: KVMirror[ScheduleState] | None = None
        self._next: dict[str, tuple[ScheduleSpec, float]] = {}  # key -> (its spec, its next tick), while acting
        self._task: asyncio.Task[None] | None = None
        self.pass_s: list[float] = []  # the last passes' cost (seconds), for the bench
        self._limit = asyncio.Semaphore(FIRE_CONCURRENCY)

    async def start(self) -> None:
        try:
            self.kv = await self._js.key_value(subjects.SCHEDULES_BUCKET)
        except (BucketNotFoundError, JsNotFound):
            self.kv = await self._js.create_key_value(bucket=subjects.SCHEDULES_BUCKET, history=1,
                                                      max_value_size=64 * 1024, storage=StorageType.FILE,
                                                      replicas=js_replicas())
        self.states = KVMirror(self.kv, _state_decoder.decode)
        await self.states.start()
        self._task = asyncio.create_task(self._run(), name="schedule-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.states is not None:
            await self.states.stop()

    def scheduled(self) -> Iterator[Scheduled]:
        """Every scheduled function of the current deployments (listed again only once they changed: the loop looks
        four times a second, and most deployed functions have no schedule)."""
        generation = self._deployments.generation
        if self._scheduled[0] != generation:
            self._scheduled = generation, [(dep, fn.name, fn.schedule) for dep in list(self._deployments.items.values())
                                           for svc in dep.manifest.services for fn in svc.functions
                                           if fn.schedule is not None]
        yield from self._scheduled[1]

    async def _run(self) -> None:
        while True:
            wait = MAX_WAIT_S
            try:
                if self._active():
                    started = time.perf_counter()
                    wait = await self.tick(time.time())
                    self.pass_s = [*self.pass_s[-999:], time.perf_counter() - started]
                else:
                    self._next.clear()  # a standby's view is rebuilt from the bucket when it acts
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("schedule loop pass failed")
            await asyncio.sleep(max(0.0, min(wait, MAX_WAIT_S)))

    async def tick(self, now: float) -> float:
        """Fire what is due at ``now``; the seconds until the next tick of any schedule."""
        assert self.states is not None
        keys = set()
        work = []
        soonest = math.inf
        for dep, function, spec in self.scheduled():
            key = state_key(dep.app, function)
            keys.add(key)
            state = self.states.items.get(key)
            cached = self._next.get(key)
            if state is not None and cached is not None and cached[0] == spec and now < cached[1] \
                    and not state.queued:
                soonest = min(soonest, cached[1])
                continue
            work.append(self._one(dep, function, spec, state, now))
        for found in await asyncio.gather(*work):
            soonest = min(soonest, found)
        await self._forget(keys)
        return soonest - time.time()

    async def _forget(self, keys: set[str]) -> None:
        """The keys of functions no longer scheduled: their app deleted, or a version without them."""
        assert self.states is not None and self.kv is not None
        for key in set(self.states.items) - keys:
            with contextlib.suppress(NatsError, OSError):
                await self.kv.delete(key)
                self.states.record(key, None, self.states.revision(key) + 1)
            self._next.pop(key, None)

    async def _one(self, dep: Deployment, function: str, spec: ScheduleSpec, state: ScheduleState | None,
                   now: float) -> float:
        """Handle one schedule at ``now``; its next tick."""
        key = state_key(dep.app, function)
        upcoming = next_tick(spec, now)
        if state is None:  # first seen: it runs from its next tick on
            await self._write(key, ScheduleState(last_tick=now), create=True)
            self._next[key] = (spec, upcoming)
            return upcoming
        new = state
        ticks, missed = due(spec, state, now)
        if state.paused:  # its ticks pass unrun: a resume does not catch them up
            if ticks or missed:
                self.metrics.runs.labels(dep.app, "paused").inc(len(ticks) + missed)
                new = msgspec.structs.replace(state, last_tick=now)
        else:
            if missed:
                self.metrics.runs.labels(dep.app, "missed").inc(missed)
                new = msgspec.structs.replace(new, last_status="missed")
            if ticks:
                new = msgspec.structs.replace(new, last_tick=ticks[-1])
            for tick in ticks:
                new = await self._tick(dep, function, spec, new, tick, now)
            if new.queued:
                new = await self._drain_queue(dep, function, new, now)
        if new != state and not await self._write(key, new):
            self._next.pop(key, None)  # written meanwhile (a pause, a resume): looked at again next pass
            return now
        self._next[key] = (spec, upcoming)
        return upcoming

    async def _tick(self, dep: Deployment, function: str, spec: ScheduleSpec, state: ScheduleState, tick: float,
                    now: float) -> ScheduleState:
        if spec.overlap != "allow" and await self._still_runs(dep.app, state.last_call_id):
            if spec.overlap == "skip":
                self.metrics.runs.labels(dep.app, "skipped").inc()
                return msgspec.structs.replace(state, last_status="skipped")
            self.metrics.runs.labels(dep.app, "queued").inc()
            return msgspec.structs.replace(state, queued=(*state.queued, tick)[-MAX_CATCH_UP:])
        return await self._fire(dep, function, state, tick, now)

    async def _drain_queue(self, dep: Deployment, function: str, state: ScheduleState, now: float) -> ScheduleState:
        """overlap="queue": the oldest waiting tick runs once the run before it has finished."""
        if await self._still_runs(dep.app, state.last_call_id):
            return state
        tick, rest = state.queued[0], state.queued[1:]
        return await self._fire(dep, function, msgspec.structs.replace(state, queued=rest), tick, now)

    async def _fire(self, dep: Deployment, function: str, state: ScheduleState, tick: float,
                    now: float) -> ScheduleState:
        call_id = tick_call_id(dep.app, function, tick)
        try:
            async with self._limit:
                await self._calls.submit(dep.app, function, b"{}", key=None, deadline=math.inf, call_id=call_id,
                                         msg_id=tick_msg_id(dep.app, function, tick))
        except EmberError as exc:
            log.warning("%s.%s: the tick at %s could not be queued: %s", dep.app, function, tick, exc)
            self.metrics.runs.labels(dep.app, "failed").inc()
            return msgspec.structs.replace(state, last_status="failed")
        self.metrics.runs.labels(dep.app, "fired").inc()
        self.metrics.lag.labels(dep.app).observe(max(0.0, time.time() - tick))
        return msgspec.structs.replace(state, last_call_id=call_id, last_status="fired", last_run_at=now,
                                       runs=state.runs + 1)

    async def _still_runs(self, app: str, call_id: str) -> bool:
        if not call_id:
            return False
        try:
            record = await self._calls.store.get(app, call_id)  # the final record, else the status
        except (NatsError, OSError):
            return True  # unknown now: not run beside it
        return record is not None and record.status not in FINAL_STATUSES

    async def _write(self, key: str, state: ScheduleState, create: bool = False) -> bool:
        """Compare-and-set against the revision last seen; False when someone wrote it meanwhile."""
        assert self.kv is not None and self.states is not None
        try:
            if create:
                revision = await self.kv.create(key, encoder.encode(state))
            else:
                revision = await self.kv.update(key, encoder.encode(state), last=self.states.revision(key))
        except KeyWrongLastSequenceError:
            return False
        except (NatsError, OSError) as exc:
            log.warning("schedule state %s not written: %s", key, exc)
            return False
        self.states.record(key, state, revision)
        return True

    # -- the API's side (any control plane) -------------------------------------------------------------------

    def find(self, app: str, function: str) -> Scheduled:
        """The scheduled function, or the 404 naming what is not there."""
        dep = self._deployments.items.get(app)
        if dep is None:
            raise NotFoundError(f"no app {app!r}", field="app")
        for found in self.scheduled():
            if found[0].app == app and found[1] == function:
                return found
        raise NotFoundError(f"{app} has no scheduled function {function!r}", field="function")

    async def set_paused(self, app: str, function: str, paused: bool) -> ScheduleState:
        """Pause or resume: a compare-and-set, tried again while the loop writes the same key."""
        assert self.kv is not None
        self.find(app, function)
        key = state_key(app, function)
        for _ in range(50):
            state, revision = await self._read(key)
            new = msgspec.structs.replace(state, paused=paused, last_tick=state.last_tick or time.time())
            if not paused and state.paused:
                new = msgspec.structs.replace(new, last_tick=time.time())  # what passed while paused stays unrun
            try:
                if revision:
                    await self.kv.update(key, encoder.encode(new), last=revision)
                else:
                    await self.kv.create(key, encoder.encode(new))
                return new
            except KeyWrongLastSequenceError:
                await asyncio.sleep(0.01)
        raise ConflictError(f"the schedule of {app}.{function} is being written; try again", field="function")

    async def run_now(self, app: str, function: str) -> str:
        """Queue a run now, outside the schedule (paused or not): an ordinary spawned call; its id."""
        self.find(app, function)
        reply = await self._calls.submit(app, function, b"{}", key=None, deadline=math.inf)
        self.metrics.runs.labels(app, "run").inc()
        assert self.kv is not None
        key = state_key(app, function)
        for _ in range(20):  # the run is what the next tick's overlap looks at
            state, revision = await self._read(key)
            new = msgspec.structs.replace(state, last_call_id=reply.call_id, last_status="run",
                                          last_run_at=time.time(), last_tick=state.last_tick or time.time())
            with contextlib.suppress(KeyWrongLastSequenceError):
                if revision:
                    await self.kv.update(key, encoder.encode(new), last=revision)
                else:
                    await self.kv.create(key, encoder.encode(new))
                break
        return reply.call_id

    async def _read(self, key: str) -> tuple[ScheduleState, int]:
        assert self.kv is not None
        try:
            entry = await self.kv.get(key)
        except (KeyNotFoundError, JsNotFound):
            return ScheduleState(), 0
        if not entry.value:
            return ScheduleState(), entry.revision or 0
        return _state_decoder.decode(entry.value), entry.revision or 0

    async def views(self, sees: Callable[[str], bool], app: str | None = None) -> list[ScheduleView]:
        """The scheduled functions of the apps ``sees`` accepts (of ``app`` alone if given), each with what became
        of its last run."""
        assert self.states is not None
        found = [(dep, fn, spec) for dep, fn, spec in self.scheduled()
                 if sees(dep.app) and (app is None or dep.app == app)]
        found.sort(key=lambda f: (f[0].app, f[1]))

        async def view(dep: Deployment, function: str, spec: ScheduleSpec) -> ScheduleView:
            state = self.states.items.get(state_key(dep.app, function)) if self.states else None
            state = state or ScheduleState()
            status = ""
            if state.last_call_id:
                with contextlib.suppress(NatsError, OSError):
                    record = await self._calls.store.get(dep.app, state.last_call_id)
                    status = record.status if record is not None else ""
            return ScheduleView(app=dep.app, function=function, schedule=describe(spec), spec=spec,
                                paused=state.paused, next_run=0.0 if state.paused else next_tick(spec, time.time()),
                                last_tick=state.last_tick, last_status=state.last_status,
                                last_call_id=state.last_call_id, last_call_status=status, runs=state.runs)

        return list(await asyncio.gather(*(view(*f) for f in found)))
