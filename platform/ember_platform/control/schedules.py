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
import heapq
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from typing import Any

import msgspec
from nats.errors import Error as NatsError
from nats.js.api import StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.errors import NotFoundError as JsNotFound
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry, Counter, Histogram

from ember._errors import ConflictError, EmberError, NotFoundError
from ember._loop import cancel_and_wait
from ember.wire import FINAL_STATUSES, Deployment, encoder, subjects
from ember.wire.atomic import allow_atomic
from ember.wire.callstore import new_call_id
from ember.wire.jetstream import KVMirror, js_replicas, kv_stream
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
    ticks_between,
    timing,
)
from ember_platform.calls.durable import Calls, Submission
from ember_platform.control import rollout
from ember_platform.control.schedule_runs import RunWatch
from ember_platform.control.schedule_writes import TickSubmitter, Write, write_states
from ember_platform.metrics import series

log = logging.getLogger("ember.schedules")
_state_decoder = msgspec.json.Decoder(ScheduleState)
MAX_WAIT_S = 0.25  # the loop looks at least this often (new deployments, a pause, the lease)
FIRE_CONCURRENCY = 1024  # state writes at once where they go one by one (not in an atomic batch)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
RETRY_S = 30.0  # a schedule whose passes raise (a zone this host's tzdata lacks, say) is looked at again after at
# most this: a quarter second after the first failure (NATS slow a moment), doubling
MAX_FINAL_KEPT = 10_000  # the final statuses of last runs the listings keep (a console polls them)
STATUSES = ("fired", "skipped", "missed", "paused", "queued", "failed", "run")


class ScheduleMetrics:
    """``ember_schedule_runs_total{app,status}`` and ``ember_schedule_lag_seconds{app}`` (tick to the run's start)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.runs = Counter("ember_schedule_runs", "Scheduled ticks by what became of them: fired, skipped (the run "
                            "before still ran), missed (catch_up), paused, queued (overlap='queue'), failed (could "
                            "not be queued), run (asked for).", ("app", "status"), registry=self.registry)
        self.lag = Histogram("ember_schedule_lag_seconds", "Time from a tick to the start of its run (its call "
                             "marked running by a replica).", ("app",), buckets=LAG_BUCKETS, registry=self.registry)
        self._generation = -1

    def follow(self, generation: int, deployed: Callable[[], Collection[str]]) -> None:
        """Drop the series of the apps no longer ``deployed``, when the deployments changed (``generation``)."""
        if generation == self._generation:
            return
        self._generation = generation
        apps = set(deployed())
        series.remove([self.runs], {labels for labels, _ in series.of(self.runs, ("app", "status"))
                                    if labels[0] not in apps})
        series.remove([self.lag], {labels for labels, _ in series.of(self.lag, ("app",)) if labels[0] not in apps})


Scheduled = tuple[Deployment, str, ScheduleSpec]  # the deployment, the function, its schedule


class ScheduleLoop:
    """Fires the due ticks. A pass costs what is due: the next tick of every schedule waits in a heap, the state
    and the previous runs' calls are known from watches (``states``, ``RunWatch``), a tick's calls are queued
    together and the states written together; a pass with nothing due pops nothing."""

    def __init__(self, js: Any, calls: Calls, deployments: KVMirror[Deployment], active: Callable[[], bool]) -> None:
        self._js = js
        self._calls = calls
        self._deployments = deployments
        self._scheduled: tuple[int, list[Scheduled]] = (-1, [])  # the scheduled functions, as of a generation
        self._active = active
        self.metrics = ScheduleMetrics()
        self.kv: KeyValue | None = None
        self.states: KVMirror[ScheduleState] | None = None
        self.runs = RunWatch(js, calls.store, self._started)
        self._task: asyncio.Task[None] | None = None
        self.passes: deque[tuple[float, int]] = deque(maxlen=1000)  # the last passes: (seconds, schedules handled)
        self._limit = asyncio.Semaphore(FIRE_CONCURRENCY)
        self._submitter = TickSubmitter(calls)
        self._atomic = False  # whether ember_schedules takes atomic batches
        self._final: dict[str, str] = {}  # call id -> its final status, for the listings (oldest first, bounded)
        self._reset()

    def _reset(self) -> None:
        """Forget what the loop knew (a standby's view is rebuilt from the buckets when it acts)."""
        self._index: dict[str, Scheduled] = {}  # key -> its scheduled function
        self._seen: dict[str, Deployment] | None = None  # the deployments the index was built from
        self._due: dict[str, float] = {}  # key -> its next tick
        self._heap: list[tuple[float, str]] = []  # (next tick, key); an entry whose tick is not _due[key] is stale
        self._dirty: set[str] = set()  # keys to look at in the next pass, due or not
        self._mine: dict[str, ScheduleState] = {}  # key -> the state this loop wrote last (its echo is no change)
        self._failed: dict[str, int] = {}  # key -> its passes that raised in a row (looked at again after a backoff)

    async def start(self) -> None:
        try:
            self.kv = await self._js.key_value(subjects.SCHEDULES_BUCKET)
        except (BucketNotFoundError, JsNotFound):
            self.kv = await self._js.create_key_value(bucket=subjects.SCHEDULES_BUCKET, history=1,
                                                      max_value_size=64 * 1024, storage=StorageType.FILE,
                                                      replicas=js_replicas())
        self._atomic = await allow_atomic(self._js, kv_stream(subjects.SCHEDULES_BUCKET))
        self.states = KVMirror(self.kv, _state_decoder.decode, on_change=self._changed)
        await self.states.start()
        self._task = asyncio.create_task(self._run(), name="schedule-loop")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        await self.runs.stop()
        if self.states is not None:
            await self.states.stop()

    def scheduled(self) -> Iterator[Scheduled]:
        """Every scheduled function of the current deployments (listed again only once they changed: the loop looks
        four times a second, and most deployed functions have no schedule)."""
        generation = self._deployments.generation
        if self._scheduled[0] != generation:
            self._scheduled = generation, [(dep, fn.name, fn.schedule) for dep in list(self._deployments.items.values())
                                           for svc in rollout.main(dep).manifest.services for fn in svc.functions
                                           if fn.schedule is not None]
        yield from self._scheduled[1]

    async def _run(self) -> None:
        acting = False
        while True:
            wait = MAX_WAIT_S
            try:
                if self._active():
                    acting = True
                    started = time.perf_counter()
                    wait, handled = await self.tick(time.time())
                    self.passes.append((time.perf_counter() - started, handled))
                elif acting:
                    acting = False
                    self._reset()
                    await self.runs.stop()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("schedule loop pass failed")
            await asyncio.sleep(max(0.0, min(wait, MAX_WAIT_S)))

    async def tick(self, now: float) -> tuple[float, int]:
        """Fire what is due at ``now``; the seconds until the next tick of any schedule, and how many schedules were
        looked at."""
        if self._deployments_changed():
            await self._reindex()
        keys = self._take_due(now)
        if keys:
            try:
                await self._handle(keys, now)
            except BaseException:  # none is lost: what was not planned again is looked at in the next pass
                self._dirty |= {key for key in keys if key not in self._due}
                raise
        self.runs.observe()
        return (self._heap[0][0] if self._heap else now + MAX_WAIT_S) - time.time(), len(keys)

    def _changed(self, key: str, value: ScheduleState | None) -> None:
        """A state written elsewhere (a pause, a resume, a run asked for, another control plane): looked at again."""
        if value is None or value != self._mine.get(key):
            self._dirty.add(key)

    def _deployments_changed(self) -> bool:
        deps = self._deployments.items
        return self._seen is None or len(deps) != len(self._seen) or any(
            self._seen.get(app) is not dep for app, dep in deps.items())

    async def _reindex(self) -> None:
        """The scheduled functions again, after a deployment changed: new or changed schedules are looked at."""
        assert self.states is not None
        self._seen = dict(self._deployments.items)
        index = {state_key(dep.app, fn): (dep, fn, spec) for dep, fn, spec in self.scheduled()}
        for key, (_dep, _fn, spec) in index.items():
            old = self._index.get(key)
            if old is None or old[2] != spec:
                self._dirty.add(key)
        self._dirty |= (set(self._index) - set(index)) | (set(self.states.items) - set(index))
        self._index = index
        await self.runs.watch({dep.app for dep, _fn, _spec in index.values()})

    def _take_due(self, now: float) -> set[str]:
        keys, self._dirty = self._dirty, set()
        while self._heap and self._heap[0][0] <= now:
            at, key = heapq.heappop(self._heap)
            if self._due.get(key) == at:
                del self._due[key]
                keys.add(key)
        return keys

    def _plan(self, key: str, at: float) -> None:
        self._due[key] = at
        heapq.heappush(self._heap, (at, key))

    async def _handle(self, keys: set[str], now: float) -> None:
        """The given schedules at ``now``: their ticks queued together, then their states written together."""
        assert self.states is not None
        gone = [key for key in keys if key not in self._index]
        for key in gone:
            await self._forget(key)
        handled = [key for key in keys if key in self._index]
        found = await asyncio.gather(*(self._one(key, now) for key in handled), return_exceptions=True)
        failed = set()
        for key, result in zip(handled, found, strict=True):
            if isinstance(result, BaseException):  # this schedule alone: every other app's goes on
                if isinstance(result, asyncio.CancelledError):
                    raise result
                failed.add(key)
                self._retry(key, now, result)
        writes = [write for write in found if write is not None and not isinstance(write, BaseException)]
        for key, new, _read in writes:
            self._mine[key] = new  # its echo from the watch may come before the answer
        done = await write_states(self._js, writes, self._atomic, self._write, self.states.record)
        for (key, _state, _read), ok in zip(writes, done, strict=True):
            if not ok:  # written meanwhile (a pause, a resume): looked at again
                self._dirty.add(key)
        for key in keys:
            if key not in self._index or key in self._dirty or key in failed:
                continue
            state = self.states.items.get(key)
            if state is not None and state.queued:  # a tick waits for the run before it: looked at in each pass
                self._dirty.add(key)
            else:
                try:
                    self._plan(key, next_tick(self._index[key][2], now))
                    self._failed.pop(key, None)
                except Exception as exc:
                    self._retry(key, now, exc)
        if len(self.runs.finished) > 2 * len(self._index) + 64:
            self.runs.keep({call for state in self.states.items.values()
                            for call in (state.last_call_id, state.tick_call_id)})

    def _retry(self, key: str, now: float, exc: BaseException) -> None:
        """A schedule whose pass raised: looked at again after a backoff, alone (the others' passes go on)."""
        failures = self._failed[key] = self._failed.get(key, 0) + 1
        delay = min(RETRY_S, MAX_WAIT_S * 2 ** min(failures - 1, 16))
        self._plan(key, now + delay)
        log.error("schedule %s could not be handled (tried again in %.1f s): %s: %s", key, delay,
                  type(exc).__name__, exc)

    async def _forget(self, key: str) -> None:
        """The key of a function no longer scheduled: its app deleted, or a version without it."""
        assert self.states is not None and self.kv is not None
        self._due.pop(key, None)
        self._mine.pop(key, None)
        if key in self.states.items:
            with contextlib.suppress(NatsError, OSError):
                await self.kv.delete(key)
                self.states.record(key, None, self.states.revision(key) + 1)

    async def _one(self, key: str, now: float) -> Write | None:
        """Handle one schedule at ``now``; the state to write, if it changed."""
        assert self.states is not None
        dep, function, spec = self._index[key]
        state = self.states.items.get(key)
        read = self.states.revision(key)  # written only if still the one read: a pause meanwhile is not undone
        # first seen, or a state kept of an app of the name deleted before (this loop did not see it go): it runs
        # from its next tick on, unpaused
        if state is None or state.of(dep.born_at) is not state:
            return key, ScheduleState(last_tick=now, born_at=dep.born_at, timing=timing(spec)), 0 if state is None \
                else read
        new = state
        if state.timing != timing(spec):  # a new version changed when it ticks: from its next tick on, no catch-up
            new = msgspec.structs.replace(state, timing=timing(spec),
                                          last_tick=max(state.last_tick, now) if state.timing else state.last_tick)
        ticks, missed = due(spec, new, now)
        if state.paused:  # its ticks pass unrun: a resume does not catch them up
            if ticks or missed:
                self.metrics.runs.labels(dep.app, "paused").inc(len(ticks) + missed)
                new = msgspec.structs.replace(new, last_tick=now)
        else:
            if missed:
                self.metrics.runs.labels(dep.app, "missed").inc(missed)
                latest = ticks[-1:] or ticks_between(spec, state.last_tick, now, limit=1)  # catch_up="none": all
                new = msgspec.structs.replace(new, last_status="missed", last_tick=latest[-1])
            if ticks:
                new = msgspec.structs.replace(new, last_tick=ticks[-1])
            for tick in ticks:
                new = await self._tick(dep, function, spec, new, tick, now)
            if new.queued:
                new = await self._drain_queue(dep, function, new, now)
        return (key, new, read) if new != state else None

    async def _tick(self, dep: Deployment, function: str, spec: ScheduleSpec, state: ScheduleState, tick: float,
                    now: float) -> ScheduleState:
        if spec.overlap == "queue" and state.queued:  # older ticks wait: this one goes after them
            self.metrics.runs.labels(dep.app, "queued").inc()
            return msgspec.structs.replace(state, queued=(*state.queued, tick)[-MAX_CATCH_UP:])
        if spec.overlap != "allow" and await self._runs_on(dep.app, state):
            if spec.overlap == "skip":
                self.metrics.runs.labels(dep.app, "skipped").inc()
                return msgspec.structs.replace(state, last_status="skipped")
            self.metrics.runs.labels(dep.app, "queued").inc()
            return msgspec.structs.replace(state, queued=(*state.queued, tick)[-MAX_CATCH_UP:])
        return await self._fire(dep, function, state, tick, now)

    async def _drain_queue(self, dep: Deployment, function: str, state: ScheduleState, now: float) -> ScheduleState:
        """overlap="queue": the oldest waiting tick runs once the run before it has finished."""
        if await self._runs_on(dep.app, state):
            return state
        tick, rest = state.queued[0], state.queued[1:]
        return await self._fire(dep, function, msgspec.structs.replace(state, queued=rest), tick, now)

    async def _runs_on(self, app: str, state: ScheduleState) -> bool:
        """Whether the last tick's run, or a run asked for since, still waits or runs."""
        return any([await self.runs.still_runs(app, call_id)
                    for call_id in dict.fromkeys((state.tick_call_id, state.last_call_id)) if call_id])

    async def _fire(self, dep: Deployment, function: str, state: ScheduleState, tick: float,
                    now: float) -> ScheduleState:
        call_id = tick_call_id(dep.app, function, tick)
        self.runs.expect(dep.app, call_id, tick)
        try:
            reply = await self._submitter.submit(Submission(dep.app, function, call_id,
                                                            tick_msg_id(dep.app, function, tick)))
        except EmberError as exc:
            self.runs.failed(call_id)
            log.warning("%s.%s: the tick at %s could not be queued: %s", dep.app, function, tick, exc)
            self.metrics.runs.labels(dep.app, "failed").inc()
            return msgspec.structs.replace(state, last_status="failed")
        if not reply.created:
            self.runs.found(call_id)
        self.metrics.runs.labels(dep.app, "fired").inc()
        return msgspec.structs.replace(state, last_call_id=call_id, tick_call_id=call_id, last_status="fired",
                                       last_run_at=now, runs=state.runs + 1)

    def _started(self, app: str, tick: float, at: float) -> None:
        if app in self._deployments.items:  # a deleted app's last run starting makes no series again
            self.metrics.lag.labels(app).observe(max(0.0, at - tick))

    async def _write(self, key: str, state: ScheduleState, read: int) -> bool:
        """Compare-and-set against the revision the new state was made from (0: create it); False when someone
        wrote it meanwhile (a pause or resume from the API, whose write this control plane's mirror may already
        show: its revision then is not the one this state was made from)."""
        assert self.kv is not None and self.states is not None
        try:
            async with self._limit:
                if not read:
                    revision = await self.kv.create(key, encoder.encode(state))
                else:
                    revision = await self.kv.update(key, encoder.encode(state), last=read)
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
        dep = self.find(app, function)[0]
        key = state_key(app, function)
        for _ in range(50):
            state, revision = await self._read(key, dep)
            new = msgspec.structs.replace(state, paused=paused, last_tick=state.last_tick or time.time())
            if not paused and state.paused:
                new = msgspec.structs.replace(new, last_tick=time.time())  # what passed while paused stays unrun
            try:
                written = await (self.kv.update(key, encoder.encode(new), last=revision) if revision
                                 else self.kv.create(key, encoder.encode(new)))
            except KeyWrongLastSequenceError:
                await asyncio.sleep(0.01)
                continue
            self._wrote(key, new, written)  # the answer and the next listing show the pause at once
            return new
        raise ConflictError(f"the schedule of {app}.{function} is being written; try again", field="function")

    async def run_now(self, app: str, function: str) -> str:
        """Queue a run now, outside the schedule (paused or not): an ordinary spawned call; its id."""
        dep = self.find(app, function)[0]
        call_id = new_call_id(app)
        self.runs.expect(app, call_id, None)
        try:
            reply = await self._calls.submit(app, function, b"{}", key=None, deadline=math.inf, call_id=call_id)
        except BaseException:
            self.runs.failed(call_id)
            raise
        self.metrics.runs.labels(app, "run").inc()
        assert self.kv is not None
        key = state_key(app, function)
        for _ in range(20):  # the run is what the next tick's overlap looks at
            state, revision = await self._read(key, dep)
            new = msgspec.structs.replace(state, last_call_id=reply.call_id, last_status="run",
                                          last_run_at=time.time(), last_tick=state.last_tick or time.time())
            with contextlib.suppress(KeyWrongLastSequenceError):
                written = await (self.kv.update(key, encoder.encode(new), last=revision) if revision
                                 else self.kv.create(key, encoder.encode(new)))
                self._wrote(key, new, written)
                break
        return reply.call_id

    def _wrote(self, key: str, state: ScheduleState, revision: int) -> None:
        """This process's own write, seen by its mirror at once (read-your-writes): a listing right after a pause
        shows it paused, whatever the watch's delay."""
        if self.states is not None:
            self.states.record(key, state, revision)

    async def _read(self, key: str, dep: Deployment | None = None) -> tuple[ScheduleState, int]:
        """The state of ``key`` (as ``dep``'s app sees it, where given) and its revision (0: none written)."""
        assert self.kv is not None
        born_at = dep.born_at if dep is not None else 0.0
        try:
            entry = await self.kv.get(key)
        except (KeyNotFoundError, JsNotFound):
            return ScheduleState(born_at=born_at), 0
        if not entry.value:
            return ScheduleState(born_at=born_at), entry.revision or 0
        state = _state_decoder.decode(entry.value)
        return state.of(born_at) if dep is not None else state, entry.revision or 0

    async def views(self, sees: Callable[[str], bool], app: str | None = None) -> list[ScheduleView]:
        """The scheduled functions of the apps ``sees`` accepts (of ``app`` alone if given), each with what became
        of its last run."""
        assert self.states is not None
        found = [(dep, fn, spec) for dep, fn, spec in self.scheduled()
                 if sees(dep.app) and (app is None or dep.app == app)]
        found.sort(key=lambda f: (f[0].app, f[1]))

        async def view(dep: Deployment, function: str, spec: ScheduleSpec) -> ScheduleView:
            state = self.states.items.get(state_key(dep.app, function)) if self.states else None
            state = (state or ScheduleState()).of(dep.born_at)
            status = self._final.get(state.last_call_id, "")
            if state.last_call_id and not status:
                with contextlib.suppress(NatsError, OSError):
                    record = await self._calls.store.get(dep.app, state.last_call_id)
                    status = record.status if record is not None else ""
                if status in FINAL_STATUSES:  # it never changes again: not read at the next listing
                    if len(self._final) >= MAX_FINAL_KEPT:
                        del self._final[next(iter(self._final))]
                    self._final[state.last_call_id] = status
            return ScheduleView(app=dep.app, function=function, schedule=describe(spec), spec=spec,
                                paused=state.paused, next_run=0.0 if state.paused else _next_run(spec),
                                last_tick=state.last_tick, last_status=state.last_status,
                                last_call_id=state.last_call_id, last_call_status=status, runs=state.runs)

        return list(await asyncio.gather(*(view(*f) for f in found)))


def _next_run(spec: ScheduleSpec) -> float:
    """The next tick, for a listing; 0 where this control plane cannot compute it (a zone its tzdata lacks)."""
    try:
        return next_tick(spec, time.time())
    except Exception:
        return 0.0

