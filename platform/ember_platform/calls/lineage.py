"""Which relayed calls each call made, so that cancelling a call cancels the calls it is waiting on.

A function's ``.remote()`` reaches its callee through a control plane's relay (``ember_platform.gateway.relay``),
which serves it in a task of its own. The task is kept here under the call that made it (the caller's app and call
id, as the relay request names them); when that call is cancelled (``Calls.cancel`` publishes
``subjects.CANCELLED_CALLS``, which every control plane reads, since any of them may relay), each such task is
cancelled: the router then cancels the callee's call on its replica, and its own relayed calls in turn. A replica
can name only its own app's calls as callers, so it can never make another app's cancel reach its tasks or its cancel
reach another app's.

A call that has no record is given up by whoever waits on it: the gateway's, when the HTTP client of a synchronous
call goes away (or its deadline passes), and the relay's, when the call that waits is cancelled. The router and the
streams then :func:`announce` it on the same subject, so that its calls end with it on whichever control plane
relays them. Only control planes may publish there (a replica's NATS permissions name its own subjects alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from ember.wire import subjects

log = logging.getLogger("ember.relay")


async def announce(nc: Client, app: str, call_id: str) -> None:
    """Tell every control plane that ``app``'s call ``call_id`` was cancelled or given up: the calls it made end."""
    with contextlib.suppress(NatsError, OSError):
        await nc.publish(subjects.CANCELLED_CALLS, f"{app} {call_id}".encode())


class Lineage:
    def __init__(self) -> None:
        self._made_by: dict[tuple[str, str], set[asyncio.Task[object]]] = {}
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
    def made_by(self, app: str, call_id: str) -> Iterator[None]:
        """The current task serves a call made by ``app``'s call ``call_id`` (nothing is kept without one)."""
        task = asyncio.current_task()
        if not call_id or task is None:
            yield
            return
        key = (app, call_id)
        self._made_by.setdefault(key, set()).add(task)
        try:
            yield
        finally:
            tasks = self._made_by.get(key)
            if tasks is not None:
                tasks.discard(task)
                if not tasks:
                    del self._made_by[key]

    def cancel(self, app: str, call_id: str) -> int:
        """Cancel the relayed calls made by ``app``'s call ``call_id``; how many there were."""
        tasks = self._made_by.pop((app, call_id), set())
        for task in tasks:
            self._cancelled.add(task)
            task.add_done_callback(self._cancelled.discard)
            task.cancel()
        if tasks:
            log.info("cancelled %d call(s) made by %s's call %s", len(tasks), app, call_id[:80])
        return len(tasks)

    def was_cancelled(self, task: asyncio.Task[object] | None) -> bool:
        """Whether ``task`` was cancelled by :meth:`cancel` (its caller is answered ``cancelled``)."""
        return task is not None and task in self._cancelled
