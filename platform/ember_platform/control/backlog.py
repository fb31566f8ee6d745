"""Calls waiting in the functions' durable queues, for the control loop (scale-up signal for queued work: a backlog
wakes a function scaled to zero).

Every function's queue is a subject of one work-queue stream (``EMBER_CALLS``), where a call stays until it is
acked: the calls a subject holds are its consumer's pending and unacknowledged ones. So one stream info per tick,
filtered on the functions' own queues (``ember.calls.<tenant>.<app>.<fn>``, not the pinned ones below them),
gives every backlog at once, and lists only the subjects that hold calls: its cost follows the busy functions, not
the deployed ones (it was one consumer info per function, every 2 s for an empty queue).

A function bound to subjects (``on=``) has a stream of its own for its events: its consumer is asked at every tick
while events wait, and every ``PENDING_IDLE_ASK_S`` while none does (events published straight to their subjects
are seen at the next ask).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from ember.wire import Deployment, subjects

log = logging.getLogger("ember.control")
PENDING_IDLE_ASK_S = 2.0  # an empty event stream's backlog is asked again this often (a JetStream API request)
OWN_QUEUES = "ember.calls.*.*.*"  # <tenant>.<app>.<fn>: each function's own queue, not the pinned ones below it

Key = tuple[str, str]  # (app, function)


class Backlog:
    """``pending``: (app, function) -> calls waiting in its queues (a function absent holds none)."""

    def __init__(self, js: Any) -> None:
        self._js = js
        self.pending: dict[Key, int] = {}
        self._calls: dict[Key, int] = {}  # calls waiting in each function's own queue
        self._queues: dict[str, Key] = {}  # queue subject -> (app, function), of the deployments seen so far
        self._events: dict[Key, int] = {}  # events waiting in each bound function's stream
        self._asked: dict[Key, float] = {}  # when each bound function's stream was last asked
        self._bound_at: tuple[int | None, set[Key]] = (None, set())  # the functions bound to subjects, as of when

    async def refresh(self, deployments: dict[str, Deployment], generation: int | None = None) -> None:
        """``generation``: the deployments' (``KVMirror.generation``); the same as last time, they are unchanged."""
        queued = await self._queued(deployments)
        if queued is not None:  # else (the stream could not be asked) what was known stands
            self._calls = queued
        if generation is None or generation != self._bound_at[0]:
            self._bound_at = generation, {(dep.app, fn.name) for dep in deployments.values()
                                          for svc in dep.manifest.services for fn in svc.functions if fn.on}
        await self._ask_events(self._bound_at[1])
        pending = dict(self._calls)
        for key, waiting in self._events.items():
            pending[key] = pending.get(key, 0) + waiting
        self.pending = {key: n for key, n in pending.items() if n > 0}

    async def _queued(self, deployments: dict[str, Deployment]) -> dict[Key, int] | None:
        try:
            info = await self._js.stream_info(subjects.CALLS_STREAM, subjects_filter=OWN_QUEUES)
        except Exception as exc:
            log.warning("could not read the queues' backlog: %s", exc)
            return None
        held = info.state.subjects or {}
        if any(subject not in self._queues for subject in held):
            self._queues = {subjects.calls(dep.app, fn): (dep.app, fn) for dep, fn in _functions(deployments)}
        return {self._queues[s]: n for s, n in held.items() if s in self._queues and self._queues[s][0] in deployments}

    async def _ask_events(self, bound: set[Key]) -> None:
        """The backlog of each function bound to subjects (``bound``), in its own event stream."""
        now = time.monotonic()
        self._events = {k: n for k, n in self._events.items() if k in bound}
        for app, function in sorted(bound):
            key = (app, function)
            if not self._events.get(key) and now - self._asked.get(key, -PENDING_IDLE_ASK_S) < PENDING_IDLE_ASK_S:
                continue
            self._asked[key] = now
            try:
                info = await self._js.consumer_info(subjects.events_stream(app, function),
                                                    subjects.calls_consumer(app, function))
            except Exception:
                continue
            self._events[key] = (info.num_pending or 0) + (info.num_ack_pending or 0)
        self._asked = {k: t for k, t in self._asked.items() if k in bound}


def _functions(deployments: dict[str, Deployment]) -> Iterable[tuple[Deployment, str]]:
    for dep in deployments.values():
        for svc in dep.manifest.services:
            for fn in svc.functions:
                yield dep, fn.name
