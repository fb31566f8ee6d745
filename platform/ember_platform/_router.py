"""Sends a synchronous call to a replica over NATS and waits for its reply within the deadline.

Protocol: the gateway publishes the call to ``ember.invoke.<tenant>.<app>.<fn>.<version>`` (a queue group
of the version's replicas) with a reply inbox of its own. The replica that takes the call acks at once
(an empty message with ``Ember-Ack: <replica id>``) and later sends the ``CallReply``. So the gateway knows
which replica holds each call and does not lose a call to a replica that dies:

- no replica subscribed ("no responders"): wait for one until the deadline, then 503;
- no ack in time, or the replica holding the call crashes: send the call again (at most
  ``MAX_ATTEMPTS`` times; every attempt shares the reply inbox, so the first answer wins);
- no answer by the deadline: 504.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from ember import _subjects as subjects
from ember._errors import DeadlineExceededError, UnavailableError
from ember._wire import ACK_HEADER, CALL_ID_HEADER, DEADLINE_HEADER, PRIORITY_HEADER, CallReply, reply_decoder

log = logging.getLogger("ember.router")

NO_REPLICA_POLL_S = 0.05
ACK_TIMEOUT_S = 2.0
LIVENESS_CHECK_S = 0.25
MAX_ATTEMPTS = 3


class _Retry(Exception):
    """Send the call again; ``counts`` is False when no replica had taken it (no responders)."""

    def __init__(self, reason: str, *, counts: bool = True) -> None:
        super().__init__(reason)
        self.counts = counts


class Router:
    """Routes synchronous calls; ``replica_alive(replica_id)`` tells whether a replica still runs."""

    def __init__(self, nc: Client, replica_alive: Callable[[str], bool]) -> None:
        self._nc = nc
        self._alive = replica_alive
        self._inbox = ""
        self._waiting: dict[str, asyncio.Queue[Msg]] = {}
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_reply)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()

    async def _on_reply(self, msg: Msg) -> None:
        queue = self._waiting.get(msg.subject.rpartition(".")[2])
        if queue is not None:
            queue.put_nowait(msg)

    async def call(self, app: str, function: str, version: int, body: bytes, *, call_id: str,
                   deadline: float) -> CallReply:
        subject = subjects.invoke(app, function, version)
        headers = {CALL_ID_HEADER: call_id, DEADLINE_HEADER: repr(deadline), PRIORITY_HEADER: "interactive"}
        queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._waiting[call_id] = queue
        try:
            attempts = 0
            while True:
                await self._nc.publish(subject, body, reply=f"{self._inbox}.{call_id}", headers=headers)
                attempts += 1
                try:
                    return await self._attempt(queue, f"{app}.{function}", call_id, deadline)
                except _Retry as retry:
                    if not retry.counts:
                        attempts -= 1
                        continue
                    if attempts >= MAX_ATTEMPTS:
                        raise UnavailableError(f"{app}.{function}: {retry} (after {attempts} attempts)",
                                               retry_after_s=1.0, call_id=call_id) from None
                    log.warning("call %s: %s; sending it again", call_id, retry)
        finally:
            del self._waiting[call_id]

    async def _attempt(self, queue: asyncio.Queue[Msg], what: str, call_id: str, deadline: float) -> CallReply:
        holder = ""
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                if holder:
                    raise DeadlineExceededError(f"{what} did not answer within its deadline", call_id=call_id)
                raise UnavailableError(f"no replica of {what} became ready before the deadline",
                                       retry_after_s=1.0, call_id=call_id)
            wait = min(remaining, LIVENESS_CHECK_S if holder else ACK_TIMEOUT_S)
            try:
                msg = await asyncio.wait_for(queue.get(), wait)
            except TimeoutError:
                if not holder and remaining > wait:
                    raise _Retry("no replica acknowledged the call") from None
                if holder and not self._alive(holder):
                    raise _Retry(f"replica {holder} died while holding the call") from None
                continue
            headers = msg.headers or {}
            if headers.get("Status") == "503":  # no responders: no replica is subscribed yet
                await asyncio.sleep(min(NO_REPLICA_POLL_S, max(remaining, 0)))
                raise _Retry("no responders", counts=False)
            if ACK_HEADER in headers:
                holder = headers[ACK_HEADER]
                continue
            return reply_decoder.decode(msg.data)
