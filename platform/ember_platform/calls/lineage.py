"""Which relayed calls each call made, so that cancelling a call cancels the calls it is waiting on.

A function's ``.remote()`` reaches its callee through a control plane's relay (``ember_platform.gateway.relay``),
which serves it in a task of its own. The task is kept here under the call that made it (the caller's app and call
id, as the relay request names them; a batch's, under every call the batch serves); when that call is cancelled
(a batch's: all of them, since the batch runs on while one waits; ``Calls.cancel`` publishes each on
``subjects.CANCELLED_CALLS``, which every control plane reads, since any of them may relay), each such task is
cancelled: the router then cancels the callee's call on its replica, and its own relayed calls in turn. A replica
can name only its own app's calls as callers, so it can never make another app's cancel reach its tasks or its cancel
reach another app's.

A call that has no record is given up by whoever waits on it: the gateway's, when the HTTP client of a synchronous
call goes away (or its deadline passes), and the relay's, when the call that waits is cancelled. The router and the
streams then :func:`announce` it on the same subject, so that its calls end with it on whichever control plane
relays them. Only control planes may publish there (a replica's NATS permissions name its own subjects alone).

A cancel can come before the calls it should end: a relay request already on its way when the announcement arrives,
or sync code that goes on calling after its call was cancelled. So the calls cancelled are remembered for a while
(``REMEMBER_S``, at most ``MAX_REMEMBERED`` of them, the oldest forgotten first), and a call made by one of them is
cancelled as soon as it is filed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from ember.wire import subjects

log = logging.getLogger("ember.relay")
MAX_REMEMBERED = 100_000  # calls cancelled that a control plane remembers, at most (the oldest forgotten first)
REMEMBER_S = 3600.0  # how long a cancelled call is remembered: its relay requests come long before


async def announce(nc: Client, app: str, call_id: str) -> None:
    """Tell every control plane that ``app``'s call ``call_id`` was cancelled or given up: the calls it made end."""
    with contextlib.suppress(NatsError, OSError):
        await nc.publish(subjects.CANCELLED_CALLS, f"{app} {call_id}".encode())


class Lineage:
    def __init__(self, remembered: int = MAX_REMEMBERED, remember_s: float = REMEMBER_S) -> None:
        self._made_by: dict[tuple[str, str], set[asyncio.Task[object]]] = {}
        self._waits: dict[asyncio.Task[object], set[tuple[str, str]]] = {}  # a task's callers not cancelled yet
        self._gone: OrderedDict[tuple[str, str], float] = OrderedDict()  # cancelled calls -> when, oldest first
        self._remembered, self._remember_s = remembered, remember_s
        self._cancelled: set[asyncio.Task[object]] = set()  # cancelled here, not by a shutdown
        self._sub: Subscription | None = None

    async def start(self, nc: Client) -> None:
        self._sub = await nc.subscribe(subjects.CANCELLED_CALLS,
                                       cb=subjects.only_on(subjects.CANCELLED_CALLS, self._on_cancelled))

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _on_cancelled(self, msg: Msg) -> None:
        app, _, call_id = msg.data.decode(errors="replace").partition(" ")
        self.cancel(app, call_id)

    @contextlib.contextmanager
    def made_by(self, app: str, *call_ids: str) -> Iterator[None]:
        """The current task serves a call made by ``app``'s calls ``call_ids`` (a batch's: all the calls it serves;
        nothing is kept without one). It is cancelled once every one of them is: at once if they all were already
        (where it next awaits), since a batch runs on as long as one of its calls waits."""
        task = asyncio.current_task()
        keys = {(app, call_id) for call_id in call_ids if call_id}
        if not keys or task is None:
            yield
            return
        waiting = {key for key in keys if not self._was_gone(key)}
        if not waiting:
            self._cancel_tasks(min(keys), {task})
            yield
            return
        self._waits[task] = waiting
        for key in waiting:
            self._made_by.setdefault(key, set()).add(task)
        try:
            yield
        finally:
            for key in self._waits.pop(task, set()):
                tasks = self._made_by.get(key)
                if tasks is not None:
                    tasks.discard(task)
                    if not tasks:
                        del self._made_by[key]

    def cancel(self, app: str, call_id: str) -> int:
        """Cancel the relayed calls made by ``app``'s call ``call_id`` (those it made alone, or whose other callers
        were cancelled too), and those it makes from now on; how many there were."""
        key = (app, call_id)
        self._remember(key)
        ended: set[asyncio.Task[object]] = set()
        for task in self._made_by.pop(key, set()):
            waiting = self._waits.get(task, set())
            waiting.discard(key)
            if not waiting:
                ended.add(task)
        self._cancel_tasks(key, ended)
        return len(ended)

    def _cancel_tasks(self, key: tuple[str, str], tasks: set[asyncio.Task[object]]) -> None:
        for task in tasks:
            self._cancelled.add(task)
            task.add_done_callback(self._cancelled.discard)
            task.cancel()
        if tasks:
            log.info("cancelled %d call(s) made by %s's call %s", len(tasks), key[0], key[1][:80])

    def _remember(self, key: tuple[str, str]) -> None:
        self._forget_old()
        self._gone.pop(key, None)
        self._gone[key] = time.monotonic()
        while len(self._gone) > self._remembered:
            self._gone.popitem(last=False)

    def _was_gone(self, key: tuple[str, str]) -> bool:
        self._forget_old()
        return key in self._gone

    def _forget_old(self) -> None:
        since = time.monotonic() - self._remember_s
        while self._gone and next(iter(self._gone.values())) < since:
            self._gone.popitem(last=False)

    def all_cancelled(self, app: str, call_ids: list[str]) -> bool:
        """Whether every one of ``app``'s calls ``call_ids`` was cancelled lately (none given: False)."""
        keys = {(app, call_id) for call_id in call_ids if call_id}
        return bool(keys) and all(self._was_gone(key) for key in keys)

    def was_cancelled(self, task: asyncio.Task[object] | None) -> bool:
        """Whether ``task`` was cancelled by :meth:`cancel` (its caller is answered ``cancelled``)."""
        return task is not None and task in self._cancelled
