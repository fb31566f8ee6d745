"""What became of scheduled runs' calls, kept in memory from a watch instead of read at each tick.

The schedule loop asks, before a tick of a function whose ``overlap`` is ``"skip"`` or ``"queue"``, whether the call
of its previous run still waits or runs. Reading that call's record at every tick cost two KV reads per function per
tick. Instead, while it holds the lease, the loop watches the final records of the apps that have scheduled functions
(``$KV.ember_calls.r.<app>.>``, headers only: an ordered consumer per app, from new messages only) and notes, for
the calls it tracks, when each ends. A call not seen since the watch began (one fired by a control plane that held
the lease before, or a run asked for on another) is read once; the watch tells the rest. The watch costs one small
message per finished call of those apps (no record's body). A final record's message carries when its run started
(``STARTED_AT_HEADER``, ``CallRecord.started_at``, set by the replica that ran it): ``ember_schedule_lag_seconds``
observes each fired tick to that start (a record without the header is read once, after the loop's pass)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from typing import Any

from nats.errors import Error as NatsError
from nats.js.api import DeliverPolicy

from ember._loop import cancel_and_wait
from ember.wire import FINAL_STATUSES, subjects
from ember.wire.callstore import CallStore
from ember.wire.headers import STARTED_AT_HEADER
from ember.wire.jetstream import kv_stream

log = logging.getLogger("ember.schedules")
_PREFIX = f"$KV.{subjects.CALLS_BUCKET}."
MAX_PENDING_READS = 10_000  # fired ticks whose run has not ended, and ended runs whose start is still to be read


class RunWatch:
    """Which tracked calls still wait or run, and when each started; owned by the schedule loop."""

    def __init__(self, js: Any, store: CallStore, started: Callable[[str, float, float], None]) -> None:
        self._js = js
        self._store = store
        self._started = started  # (app, tick, when the run started), once per fired tick that starts
        self._subs: dict[str, Any] = {}  # app -> its subscription
        self.finished: dict[str, bool] = {}  # call id -> ended (True) or still waits or runs (False), as last told
        self._ticks: dict[str, tuple[str, float]] = {}  # call id -> (app, tick) of a fired tick not yet started
        self._reading: set[str] = set()  # call ids read now: a watch message meanwhile wins over the read
        self._ended: list[tuple[str, float, str]] = []  # (app, tick, call id) of fired ticks whose run ended
        self._reader: asyncio.Task[None] | None = None  # reads their start times

    async def watch(self, apps: set[str]) -> None:
        """Watch exactly ``apps``' call keys. What was known of an app newly watched may be stale: forgotten."""
        for app in set(self._subs) - apps:
            await self._unsubscribe(app)
        for app in apps - set(self._subs):
            self._forget_app(app)
            try:
                self._subs[app] = await self._js.subscribe(
                    _PREFIX + subjects.calls_keys_of_app("r", app), stream=kv_stream(subjects.CALLS_BUCKET),
                    cb=self._on_message, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW, headers_only=True,
                    inactive_threshold=300.0)
            except (NatsError, OSError, TimeoutError) as exc:
                log.warning("the calls of %s are not watched (%s): their records are read at each tick", app, exc)

    async def stop(self) -> None:
        if self._reader is not None:
            await cancel_and_wait(self._reader)
        self._ended.clear()
        for app in list(self._subs):
            await self._unsubscribe(app)
        self.finished.clear()
        self._ticks.clear()

    def expect(self, app: str, call_id: str, tick: float | None) -> None:
        """A call about to be queued by the loop (``tick``) or asked for (None): it waits. Said before the call is
        queued, so that its end is caught however soon it comes."""
        if app in self._subs:
            self.finished[call_id] = False
            if tick is not None:
                self._ticks[call_id] = (app, tick)
                if len(self._ticks) > MAX_PENDING_READS:  # runs that never end: the oldest are not observed
                    del self._ticks[next(iter(self._ticks))]

    def failed(self, call_id: str) -> None:
        """The call expected could not be queued."""
        self.finished.pop(call_id, None)
        self._ticks.pop(call_id, None)

    def found(self, call_id: str) -> None:
        """The call expected was there before (a tick fired again after its state could not be written): it may
        have ended already, and no watch message will say so again; its record is read when next asked about."""
        self.finished.pop(call_id, None)
        self._ticks.pop(call_id, None)

    async def still_runs(self, app: str, call_id: str) -> bool:
        """Whether ``call_id`` (of ``app``) still waits or runs: known from the watch, or read once."""
        if not call_id:
            return False
        if call_id in self.finished:
            return not self.finished[call_id]
        self._reading.add(call_id)
        try:
            record = await self._store.get(app, call_id)  # the final record, else the status
        except (NatsError, OSError, TimeoutError):
            return True  # unknown now: not run beside it
        finally:
            self._reading.discard(call_id)
        ended = record is None or record.status in FINAL_STATUSES
        if call_id in self.finished:  # told by the watch while reading
            return not self.finished[call_id]
        if app in self._subs:
            self.finished[call_id] = ended
        return not ended

    def keep(self, call_ids: set[str]) -> None:
        """Forget whether calls other than ``call_ids`` (the schedules' last calls) ended: bounded by the schedules."""
        for call_id in [c for c in self.finished if c not in call_ids]:
            del self.finished[call_id]

    def _on_message_sync(self, subject: str, started_at: str | None) -> None:
        _, app, call_id = subject[len(_PREFIX):].split(".", 2)
        if call_id.partition("_")[0] != app:  # a record under one app's key naming another app's call (the keys a
            return  # replica may write: its own app's, any id after them) tells nothing of that call
        fired = self._ticks.pop(call_id, None)
        if call_id in self.finished or call_id in self._reading:
            self.finished[call_id] = True
        if fired is None:
            return
        try:
            started = float(started_at) if started_at else 0.0
        except ValueError:
            started = 0.0
        if math.isfinite(started) and started > 0:
            self._started(*fired, started)
        elif len(self._ended) < MAX_PENDING_READS:  # a record without the header (a replica of an older version)
            self._ended.append((*fired, call_id))

    def observe(self) -> None:
        """Read the start of the runs that ended, in one task beside the loop (after a pass: never while a tick's
        calls are being queued)."""
        if self._ended and (self._reader is None or self._reader.done()):
            ended, self._ended = self._ended, []
            self._reader = asyncio.create_task(self._observe(ended), name="schedule-lag")

    async def _observe(self, ended: list[tuple[str, float, str]]) -> None:
        """Each tick's lag to its run's start, from the run's final record."""
        async def one(app: str, tick: float, call_id: str) -> None:
            with contextlib.suppress(NatsError, OSError, TimeoutError):
                record = await self._store.result(app, call_id)
                if record is not None and record.started_at:
                    self._started(app, tick, record.started_at)

        await asyncio.gather(*(one(*run) for run in ended))

    async def _on_message(self, msg: Any) -> None:
        self._on_message_sync(msg.subject, (msg.headers or {}).get(STARTED_AT_HEADER))

    def _forget_app(self, app: str) -> None:
        prefix = f"{app}_"
        for call_id in [c for c in self.finished if c.startswith(prefix)]:
            del self.finished[call_id]

    async def _unsubscribe(self, app: str) -> None:
        sub = self._subs.pop(app)
        with contextlib.suppress(NatsError, OSError, TimeoutError):
            await sub.unsubscribe()
        self._forget_app(app)
