"""A replica's pulls from one durable consumer, over JetStream's own pull protocol, that a stop ends at once.

nats-py's ``fetch`` holds the calls it got in its own variables while it waits for the rest of its batch, and
cannot be interrupted without losing them (they would come back only after the consumer's ack wait). So a
stopping replica waited for each pull to expire on the server (``FETCH_WAIT_S``) before it could leave. Here
each pull request has a reply subject of its own under this puller's inbox (the end of one, the server's 408 at
its expiry, is never taken for another's), every message delivered lands in one queue, and nothing is held
anywhere else: a stop withdraws the inbox (``close``: nats-server serves no waiting pull request whose reply
subject has lost its interest), and what had already been delivered is handed back to be nak'ed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError

# A pull waits this long on the server for a call (one arriving is delivered at once): an idle worker asks every
# few seconds, not twice a second. A stop does not wait for it.
FETCH_WAIT_S = 2.0
CLOSE_WAIT_S = 2.0  # the most a stop waits for the server to confirm it forgot the inbox
_LATE_S = 1.0  # the server's 408 may come this much after the pull's expiry before the pull gives up on it
_EMPTY = {"404", "408"}  # no messages; the request expired


class PullError(Exception):
    """The server ended a pull request with an error (409: the consumer was deleted, a leader changed, too many
    waiting requests; 503: no JetStream answered): the caller pulls again after a pause."""


@dataclass
class _Request:
    """A pull request the server may still serve: how many calls it may still deliver, and when it expires (with the
    margin its 408 may come late by)."""

    calls: int
    ends: float


class Puller:
    """Pulls from durable consumer ``durable`` of ``stream`` on connection ``nc`` (see the module's docstring).

    A pull request lingers on the server after its pull returned, delivering what comes until its batch is full or it
    expires; so the calls its requests may still deliver are counted (``outstanding``), and a pull asks only for the
    room left beyond them: the requests of a worker never add up to more calls than it asked room for. (They added up
    before: a call trickling in every few ms, each pull asked for the whole room again, and the calls delivered past
    it waited here unseen, not kept in progress, while other replicas found the queue empty; after the ack wait they
    were sent to another replica, and ran twice.) What is delivered but not taken yet (the worker's room shrank
    meanwhile) is ``waiting``, for the worker to keep in progress."""

    def __init__(self, nc: Any, stream: str, durable: str) -> None:
        self._nc = nc
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._delivered: deque[Msg] = deque()
        self._arrived = asyncio.Event()
        self._live: dict[str, _Request] = {}  # by reply subject
        self._sub: Any = None
        self._requests = 0

    async def open(self) -> None:
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_message)

    async def _on_message(self, msg: Msg) -> None:
        status = (msg.headers or {}).get("Status")
        if status is None and self._live:  # a call: it comes under its own subject, so it is counted against the
            reply, request = next(iter(self._live.items()))  # oldest request (the total is what matters)
            request.calls -= 1
            if request.calls <= 0:
                del self._live[reply]
        elif status not in (None, "100"):  # a request ended (expired, or an error): on its own reply subject
            self._live.pop(msg.subject, None)
        self._delivered.append(msg)
        self._arrived.set()

    @property
    def outstanding(self) -> int:
        """The calls the requests still on the server may deliver."""
        now = asyncio.get_running_loop().time()
        for reply in [reply for reply, request in self._live.items() if request.ends <= now]:
            del self._live[reply]  # its 408 never came (a reconnect lost it): served no more
        return sum(request.calls for request in self._live.values())

    def waiting(self) -> list[Msg]:
        """The calls delivered and not taken yet."""
        return [msg for msg in self._delivered if (msg.headers or {}).get("Status") is None]

    async def pull(self, room: int, stop: asyncio.Event | None = None) -> list[Msg]:
        """Up to ``room`` calls: those delivered already, else the first to arrive within ``FETCH_WAIT_S`` (from a
        request made now for the room the lingering ones leave, or from those) with whatever came with it. A lone
        call is not held until the pull expires or ``room`` calls came. Raises nats' TimeoutError when none came
        before a request expired, or when ``stop`` was set first; ``PullError`` when the server ended one
        with an error."""
        if got := self._take(room):
            return got
        loop = asyncio.get_running_loop()
        wanted = room - self.outstanding
        if wanted > 0:
            self._requests += 1
            reply = f"{self._inbox}.{self._requests}"
            self._live[reply] = _Request(calls=wanted, ends=loop.time() + FETCH_WAIT_S + _LATE_S)
            request = {"batch": wanted, "expires": int(FETCH_WAIT_S * 1e9)}
            await self._nc.publish(self._next_subject, json.dumps(request).encode(), reply=reply)
        deadline = min((request.ends for request in self._live.values()), default=loop.time())
        while True:
            msg = await self._next(deadline - loop.time(), stop)
            if msg is None:
                raise NatsTimeoutError
            status = (msg.headers or {}).get("Status")
            if status is None:
                return [msg, *self._take(room - 1)]
            if status == "100":  # a heartbeat
                continue
            if status in _EMPTY:  # a request expired: the caller pulls again, asking for the room it left
                raise NatsTimeoutError
            raise PullError(f"{status} {(msg.headers or {}).get('Description', '')}".strip())

    async def close(self) -> list[Msg]:
        """Stop pulling: the server forgets this puller's inbox (and with it every pull request still waiting
        there), then the calls it had delivered and no pull took are returned, for the caller to hand back."""
        sub, self._sub = self._sub, None
        if sub is not None:
            try:  # the server's answer to the unsubscribe comes after all it had sent
                await asyncio.wait_for(sub.drain(), CLOSE_WAIT_S)
            except Exception:  # the connection lost or closing: what it had delivered comes again after ack wait
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        self._live.clear()
        return self._take(None)

    def _take(self, room: int | None) -> list[Msg]:
        """What was delivered and not taken yet, calls only, at most ``room`` of them (None: all)."""
        got: list[Msg] = []
        while (room is None or len(got) < room) and self._delivered:
            msg = self._delivered.popleft()
            if (msg.headers or {}).get("Status") is None:
                got.append(msg)
        return got

    async def _next(self, timeout_s: float, stop: asyncio.Event | None) -> Msg | None:
        """The next message delivered within ``timeout_s``; None at the timeout or once ``stop`` is set."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self._delivered:
            left = deadline - loop.time()
            if left <= 0 or (stop is not None and stop.is_set()):
                return None
            self._arrived.clear()
            waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(self._arrived.wait())}
            if stop is not None:
                waits.add(asyncio.ensure_future(stop.wait()))
            try:
                await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
        return self._delivered.popleft()
