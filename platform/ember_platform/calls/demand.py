"""Synchronous calls that wait at another control plane for a service with no replica.

Every control plane serves HTTP and routes calls; only the lease holder's control loop scales. A call to a function
scaled to zero wakes that loop through the router of the control plane it reached (``Router.on_unserved``), which
is the holder's only when the call reached the holder: one that reached a standby (two behind a load balancer) was
never seen, and waited until its deadline. The router of every control plane now also says so on
``subjects.UNSERVED_CALLS``; each control plane counts what the others said, for ``HOLD_S``, as calls in flight and
received at its own gateway, so that whichever holds the lease then (or takes it over meanwhile) starts a replica."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from ember.wire import subjects
from ember.wire.validate import PY_NAME, is_app_name

HOLD_S = 30.0  # a call told of counts this long (a cold start's time, and more)
MAX_KEYS = 10_000  # services told of and not yet forgotten


class Demand:
    """What the other control planes said of their unserved calls; ``wake()`` when one is told of."""

    def __init__(self, holder: str, wake: Callable[[], None], exists: Callable[[str, str], bool]) -> None:
        self._holder = holder  # this control plane (its own messages are its router's, counted there)
        self._wake = wake
        self._exists = exists  # (app, service) -> whether it is deployed
        self._until: dict[tuple[str, str], float] = {}  # (app, service) -> until when it counts as in flight
        self.received: Counter[tuple[str, str]] = Counter()
        self._nc: Client | None = None
        self._sub: Subscription | None = None
        self._telling: set[asyncio.Task[None]] = set()

    async def start(self, nc: Client) -> None:
        self._nc = nc
        self._sub = await nc.subscribe(subjects.UNSERVED_CALLS,
                                       cb=subjects.only_on(subjects.UNSERVED_CALLS, self._on_told))

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        for task in list(self._telling):
            task.cancel()

    def tell(self, app: str, service: str) -> None:
        """Say that a call waits here for ``app``'s ``service``, which has no replica (from the router, in a task)."""
        if self._nc is None:
            return
        task = asyncio.get_running_loop().create_task(self._publish(f"{self._holder} {app} {service}".encode()))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    async def _publish(self, data: bytes) -> None:
        assert self._nc is not None
        with contextlib.suppress(NatsError, OSError):
            await self._nc.publish(subjects.UNSERVED_CALLS, data)

    def in_flight(self, app: str, service: str) -> int:
        """1 while another control plane's call for ``app``'s ``service`` was told of within ``HOLD_S``, else 0."""
        until = self._until.get((app, service))
        if until is None:
            return 0
        if until < time.monotonic():
            del self._until[(app, service)]
            return 0
        return 1

    async def _on_told(self, msg: Msg) -> None:
        parts = msg.data.decode(errors="replace").split(" ")
        if len(parts) != 3 or parts[0] == self._holder:
            return
        _, app, service = parts
        if not (is_app_name(app) and PY_NAME.fullmatch(service) and self._exists(app, service)):
            return
        if len(self._until) >= MAX_KEYS:
            now = time.monotonic()
            self._until = {k: t for k, t in self._until.items() if t >= now}
            if len(self._until) >= MAX_KEYS:
                return
        self._until[(app, service)] = time.monotonic() + HOLD_S
        self.received[(app, service)] += 1
        self._wake()
