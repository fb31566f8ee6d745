"""What became of scheduled runs' calls, kept in memory from a watch instead of read at each tick.

The schedule loop asks, before a tick of a function whose ``overlap`` is ``"skip"`` or ``"queue"``, whether the call
of its previous run still waits or runs. Reading that call's record at every tick cost two KV reads per function per
tick. Instead, while it holds the lease, the loop watches the call keys of the apps that have scheduled functions
(``$KV.ember_calls.*.<app>.>``: an ordered consumer per app, from new messages only) and notes, for the calls it
tracks, when each starts (its status becomes ``running``: ``ember_schedule_lag_seconds`` observes its tick to that
moment) and when it ends (its final record, or a final status). A call not seen since the watch began (one fired
by a control plane that held the lease before, or a run asked for on another) is read once; the watch tells the
rest. The cost of the watch is one small message per status change of those apps' calls.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import msgspec
from nats.errors import Error as NatsError
from nats.js.api import DeliverPolicy

from ember.wire import FINAL_STATUSES, CallRecord, subjects
from ember.wire.callstore import CallStore
from ember.wire.jetstream import kv_stream

log = logging.getLogger("ember.schedules")
_record_decoder = msgspec.json.Decoder(CallRecord)
_PREFIX = f"$KV.{subjects.CALLS_BUCKET}."


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

    async def watch(self, apps: set[str]) -> None:
        """Watch exactly ``apps``' call keys. What was known of an app newly watched may be stale: forgotten."""
        for app in set(self._subs) - apps:
            await self._unsubscribe(app)
        for app in apps - set(self._subs):
            self._forget_app(app)
            try:
                self._subs[app] = await self._js.subscribe(
                    _PREFIX + subjects.calls_keys_of_app("*", app), stream=kv_stream(subjects.CALLS_BUCKET),
                    cb=self._on_message, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW,
                    inactive_threshold=300.0)
            except (NatsError, OSError, TimeoutError) as exc:
                log.warning("the calls of %s are not watched (%s): their records are read at each tick", app, exc)

    async def stop(self) -> None:
        for app in list(self._subs):
            await self._unsubscribe(app)
        self.finished.clear()
        self._ticks.clear()

    def fired(self, app: str, call_id: str, tick: float | None) -> None:
        """A call just queued by the loop (``tick``) or asked for (None): it waits."""
        if app in self._subs:
            self.finished[call_id] = False
            if tick is not None:
                self._ticks[call_id] = (app, tick)

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
        """Forget every call but ``call_ids`` (the schedules' last calls): memory bounded by the schedules."""
        for table in (self.finished, self._ticks):
            for call_id in [c for c in table if c not in call_ids]:
                del table[call_id]

    def _on_message_sync(self, subject: str, data: bytes) -> None:
        kind, _, rest = subject[len(_PREFIX):].partition(".")
        _app, _, call_id = rest.partition(".")
        if call_id not in self.finished and call_id not in self._reading:
            return
        if kind == "r":
            self.finished[call_id] = True
            self._ticks.pop(call_id, None)
            return
        if kind != "s":
            return
        if not data:  # the status removed: the call was never queued after all
            self.finished[call_id] = True
            return
        try:
            record = _record_decoder.decode(data)
        except msgspec.DecodeError:
            return
        if record.status in FINAL_STATUSES:
            self.finished[call_id] = True
        elif record.status == "running" and call_id in self._ticks:
            app, tick = self._ticks.pop(call_id)
            self._started(app, tick, record.updated_at)

    async def _on_message(self, msg: Any) -> None:
        self._on_message_sync(msg.subject, msg.data)

    def _forget_app(self, app: str) -> None:
        prefix = f"{app}_"
        for call_id in [c for c in self.finished if c.startswith(prefix)]:
            del self.finished[call_id]

    async def _unsubscribe(self, app: str) -> None:
        sub = self._subs.pop(app)
        with contextlib.suppress(NatsError, OSError, TimeoutError):
            await sub.unsubscribe()
        self._forget_app(app)
