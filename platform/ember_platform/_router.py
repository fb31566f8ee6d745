"""Sends a synchronous call to a replica over NATS and waits for its reply within the deadline.

Routing: replicas publish load reports (queued and running calls, cost per call) ten times a second.
The gateway picks two fresh reports at random and sends the call to the replica with the lower estimated
wait (power of two choices), counting the calls it sent there since; without fresh reports it publishes
to ``ember.invoke.<tenant>.<app>.<fn>.<version>``, the queue group of the version's replicas.

Protocol: the call carries a reply inbox of the gateway's own. The replica that takes the call and has not
answered it within a few milliseconds acks it (an empty message with ``Ember-Ack: <replica id>``; a fast
answer needs no ack, which saves a message each way on the common path) and later sends the ``CallReply``.
So the gateway knows which replica holds each call and does not lose a call to a replica that dies:

- no replica subscribed ("no responders"): wait for one until the deadline, then 503;
- no ack in time, or the replica holding the call crashes: send the call again (at most
  ``MAX_ATTEMPTS`` times; every attempt shares the reply inbox, so the first answer wins);
- no answer by the deadline: 504.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from ember import _subjects as subjects
from ember._errors import DeadlineExceededError, UnavailableError
from ember._wire import (
    ACK_HEADER,
    CALL_ID_HEADER,
    DEADLINE_HEADER,
    FUNCTION_HEADER,
    PRIORITY_HEADER,
    CallReply,
    LoadReport,
    load_decoder,
    reply_decoder,
)

log = logging.getLogger("ember.router")

NO_REPLICA_POLL_S = 0.05
REPORT_FRESH_S = 1.0
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
        self._waiting: dict[str, _Pending] = {}
        self.in_flight: Counter[tuple[str, str]] = Counter()  # (app, service) -> calls in flight
        self.received: Counter[tuple[str, str]] = Counter()  # (app, service) -> calls received, ever
        self._services: dict[tuple[str, str], set[tuple[str, str, int]]] = {}  # (app, service) -> report keys
        self._reports: dict[tuple[str, str, int], dict[str, tuple[float, LoadReport]]] = {}
        self._sent: Counter[str] = Counter()  # replica id -> calls sent to it and not answered yet
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._subs = [await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_reply),
                      await self._nc.subscribe(subjects.STATS_ALL, cb=self._on_report)]

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()

    async def _on_report(self, msg: Msg) -> None:
        try:
            report = load_decoder.decode(msg.data)
        except Exception:
            return
        key = (report.app, report.function, report.version)
        self._reports.setdefault(key, {})[report.replica_id] = (time.monotonic(), report)
        self._services.setdefault((report.app, report.function.split(".")[0]), set()).add(key)

    def capacity(self, app: str, service: str) -> float | None:
        """Calls per second one replica of the service serves in full batches, by the replicas' own estimate:
        one over the median predicted cost of a call (``per_call_s``) in its fresh reports; None without one."""
        now = time.monotonic()
        costs = [r.per_call_s for key in self._services.get((app, service), ())
                 for at, r in self._reports[key].values() if now - at < REPORT_FRESH_S and r.per_call_s > 0]
        return 1.0 / statistics.median(costs) if costs else None

    def choose(self, app: str, function: str, version: int, exclude: set[str]) -> str | None:
        """The replica to send a call to (power of two choices on fresh reports), or None: use the queue group."""
        now = time.monotonic()
        fresh = [r for at, r in self._reports.get((app, function, version), {}).values()
                 if now - at < REPORT_FRESH_S and r.replica_id not in exclude and self._alive(r.replica_id)]
        if not fresh:
            return None
        pair = random.sample(fresh, min(2, len(fresh)))
        timed = all(r.per_call_s > 0 for r in pair)  # compare seconds only when both replicas measured them
        return min(pair, key=lambda r: self._waiting_calls(r) * (r.per_call_s if timed else 1.0)).replica_id

    def _waiting_calls(self, report: LoadReport) -> int:
        return report.queued + report.in_flight + self._sent[report.replica_id] + 1

    async def _on_reply(self, msg: Msg) -> None:
        pending = self._waiting.get(msg.subject.rpartition(".")[2])
        if pending is not None:
            pending.deliver(msg)

    async def call(self, app: str, function: str, version: int, body: bytes, *, call_id: str,
                   deadline: float) -> CallReply:
        """Send the call and wait for its reply; if this is cancelled (the caller went away), the replica
        holding the call is told to drop it."""
        group_subject = subjects.invoke(app, function, version)
        headers = {CALL_ID_HEADER: call_id, DEADLINE_HEADER: repr(deadline), PRIORITY_HEADER: "interactive",
                   FUNCTION_HEADER: function}
        tried: set[str] = set()
        pending = _Pending(f"{app}.{function}", call_id, deadline)
        self._waiting[call_id] = pending
        load_key = (app, function.split(".")[0])
        self.received[load_key] += 1
        self.in_flight[load_key] += 1
        try:
            attempts = 0
            while True:
                target = self.choose(app, function, version, tried)
                subject = subjects.replica_invoke(target) if target else group_subject
                await self._nc.publish(subject, body, reply=f"{self._inbox}.{call_id}", headers=headers)
                attempts += 1
                pending.sent_to = target or ""
                if target:
                    self._sent[target] += 1
                try:
                    reply = await self._attempt(pending)
                    pending.answered = True
                    return reply
                except _Retry as retry:
                    if target:
                        tried.add(target)  # the next attempt goes elsewhere
                    if not retry.counts:
                        attempts -= 1
                        continue
                    if attempts >= MAX_ATTEMPTS:
                        raise UnavailableError(f"{pending.what}: {retry} (after {attempts} attempts)",
                                               retry_after_s=1.0, call_id=call_id) from None
                    log.warning("call %s: %s; sending it again", call_id, retry)
                    pending.holder = ""
                finally:
                    if target:
                        self._sent[target] -= 1
                        if self._sent[target] <= 0:
                            del self._sent[target]
        finally:
            del self._waiting[call_id]
            self.in_flight[load_key] -= 1
            if not self.in_flight[load_key]:
                del self.in_flight[load_key]
            holder = pending.holder or pending.sent_to  # a call answered fast is never acked
            if holder and not pending.answered:
                await asyncio.shield(self._cancel(holder, call_id))

    async def _cancel(self, replica_id: str, call_id: str) -> None:
        try:
            await self._nc.publish(subjects.replica_cancel(replica_id), call_id.encode())
        except Exception as exc:  # the call is abandoned either way; the replica drops it at its deadline
            log.warning("could not cancel call %s on %s: %s", call_id, replica_id, exc)

    async def _attempt(self, pending: _Pending) -> CallReply:
        while True:
            remaining = pending.deadline - time.time()
            if remaining <= 0:
                if pending.holder:
                    raise DeadlineExceededError(f"{pending.what} did not answer within its deadline",
                                                call_id=pending.call_id)
                raise UnavailableError(f"no replica of {pending.what} became ready before the deadline",
                                       retry_after_s=1.0, call_id=pending.call_id)
            wait = min(remaining, LIVENESS_CHECK_S if pending.holder else ACK_TIMEOUT_S)
            try:
                msg = await pending.next(wait)
            except TimeoutError:
                if not pending.holder and remaining > wait:
                    raise _Retry("no replica acknowledged the call") from None
                if pending.holder and not self._alive(pending.holder):
                    raise _Retry(f"replica {pending.holder} died while holding the call") from None
                continue
            headers = msg.headers or {}
            if headers.get("Status") == "503":  # no responders: no replica is subscribed yet
                await asyncio.sleep(min(NO_REPLICA_POLL_S, max(remaining, 0)))
                raise _Retry("no responders", counts=False)
            if ACK_HEADER in headers:
                pending.holder = headers[ACK_HEADER]
                continue
            reply = reply_decoder.decode(msg.data)
            if reply.error is not None and reply.error.code == UnavailableError.code:
                raise _Retry(f"replica {pending.holder or '?'} is shutting down")  # it never ran the call
            return reply


@dataclass
class _Pending:
    """One call in flight: the messages that arrived for it, which replica holds it (once acked) and which
    one it was last sent to (empty for the queue group).

    Waiting is a bare future and a timer rather than ``asyncio.Queue`` and ``wait_for``: this runs for every
    synchronous call, and ``wait_for`` costs a task per wait."""

    what: str
    call_id: str
    deadline: float
    holder: str = ""
    sent_to: str = ""
    answered: bool = False
    _inbox: deque[Msg] = field(default_factory=deque)
    _waiter: asyncio.Future[Msg] | None = None

    def deliver(self, msg: Msg) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(msg)
        else:
            self._inbox.append(msg)

    async def next(self, timeout: float) -> Msg:
        """The next message for this call; ``TimeoutError`` after ``timeout`` seconds without one."""
        if self._inbox:
            return self._inbox.popleft()
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, _expire, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiter = None


def _expire(waiter: asyncio.Future[Msg]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
