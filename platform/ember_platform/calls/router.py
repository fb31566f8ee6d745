"""Sends a synchronous call to a replica over NATS and waits for its reply within the deadline.

Routing: replicas publish load reports (queued and running calls, cost per call) ten times a second.
The gateway picks two fresh reports at random and sends the call to the replica with the lower estimated
wait (power of two choices), counting the calls it sent there since; without fresh reports it publishes
to ``ember.invoke.<tenant>.<app>.<fn>.<version>``, the queue group of the version's replicas.

Frames: calls travel as ``Invocation``s in lists, one NATS message for all the calls sent to the same subject
in one turn of the event loop, and replicas answer in lists too (``Answer``s, one message per frame's reply
inbox and turn of their loop). Under load, calls arrive in bursts (a batch's callers send their next calls
together), so a message carries many calls each way: the per-message costs of the NATS client, the server
and the replica are paid per burst rather than per call. A call alone still goes out at once.

Protocol: each frame carries a reply inbox of the gateway's own (``<inbox>.<app>.<frame id>``, the id random:
a replica can publish answers only under its own app, and only to the frames it was sent; an answer for a call
that its frame did not carry is dropped). A replica that takes
a call and has not answered it within a few milliseconds acks it (an ``Answer`` with ``ack`` set to its
id; a fast answer needs no ack, which saves a message on the common path) and later sends the answer.
So the gateway knows which replica holds each call and does not lose a call to a replica that dies:

- no replica subscribed ("no responders", for the whole frame): wait for one until the deadline, then 503;
- no ack in time, the replica holding the call crashes, or it refuses the call (``unavailable`` with no ``type``:
  shutting down, before any run): send the call again (at most ``MAX_ATTEMPTS`` times; the first answer wins); an
  error the function's run ended with has a ``type`` (``ember_runtime.batching.isolation``) and is the answer;
- no answer by the deadline: 504.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from ember import _tracing as tracing
from ember._errors import DeadlineExceededError, UnavailableError
from ember.wire import (
    Answer,
    Invocation,
    Outbox,
    answers_decoder,
    encoder,
    is_json_frame,
    load_decoder,
    packed_answers_decoder,
    packed_encoder,
    split_frames,
    subjects,
)
from ember.wire.calls import Hop
from ember_platform.calls import lineage
from ember_platform.calls.choice import LoadBoard, Unreported, choose, fewest_running

log = logging.getLogger("ember.router")

NO_REPLICA_POLL_S = 0.05
ACK_TIMEOUT_S = 2.0
LIVENESS_CHECK_S = 0.25
UNACKED_CHECK_S = 0.05  # a call sent to a replica and not acknowledged yet (usually for a few ms): is it still there
MAX_ATTEMPTS = 3
_UNTRACED: dict[str, str] = {}  # an Invocation's trace context when tracing is off (never written to)


class _Retry(Exception):
    """Send the call again; ``counts`` is False when no replica had taken it (no responders)."""

    def __init__(self, reason: str, *, counts: bool = True) -> None:
        super().__init__(reason)
        self.counts = counts


class _NoResponders:
    """Delivered to the calls of a frame that no replica was subscribed to receive."""


NO_RESPONDERS = _NoResponders()


class Router:
    """Routes synchronous calls; ``replica_alive(replica_id)`` tells whether a replica still runs."""

    def __init__(self, nc: Client, replica_alive: Callable[[str], bool],
                 replica_of: Callable[[str, str], bool] | None = None) -> None:
        self._nc = nc
        self._alive = replica_alive
        # (replica id, app) -> whether that replica is the app's, as the registry knows it (None: no registry here)
        self._replica_of = replica_of
        self._inbox = ""  # answers arrive under <inbox>.<app>.<frame token>
        self._waiting: dict[str, _Pending] = {}
        self.in_flight: Counter[tuple[str, str]] = Counter()  # (app, service) -> calls in flight
        self.received: Counter[tuple[str, str]] = Counter()  # (app, service) -> calls received, ever
        self.loads = LoadBoard()
        self.capacity = self.loads.capacity
        self._sent: Counter[str] = Counter()  # replica id -> calls sent to it and not answered yet
        self.streams_on: Counter[str] = Counter()  # replica id -> streams sent to it that have not ended
        self.unreported = Unreported()  # the streams sent to each replica that its last report does not count
        self.on_unserved: Callable[[str, str], None] = lambda _app, _service: None  # (app, service): a call came
        # and no replica of it is known (a function at zero): the control plane wakes its loop, not waiting a tick
        self.loads.on_forget = self.unreported.forget
        self._subs: list[Subscription] = []
        self._outbox: Outbox[str, _Pending] = Outbox(self._frame)  # subject -> calls to send in this turn
        self._packed: Outbox[str, _Pending] = Outbox(self._packed_frame)  # the same, for msgpack frames
        self._frames: dict[str, _Frame] = {}  # frame id -> the calls it carried that still wait

    async def start(self) -> None:
        self._inbox = subjects.answers_inbox(secrets.token_hex(8))
        answers = f"{self._inbox}.*.*"  # the replicas' answers, and the server's "no responders" to a frame
        self._subs = [await self._nc.subscribe(answers, cb=subjects.only_on(answers, self._on_answers, statuses=True)),
                      await self._nc.subscribe(subjects.STATS_ALL, cb=subjects.only_on(subjects.STATS_ALL,
                                                                                        self._on_report))]

    @property
    def idle(self) -> bool:
        """Nothing held: no call waiting, queued or counted in a frame."""
        return not self._waiting and not self._frames and not self._outbox and not self._packed

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()

    async def _on_report(self, msg: Msg) -> None:
        try:
            report = load_decoder.decode(msg.data)
            if msg.subject != subjects.stats(report.app, report.function):
                return  # a report speaks for the app whose subject its replica may publish on, and no other
        except Exception:
            return
        self.loads.record(report)
        self.unreported.reported(report)

    def choose(self, app: str, function: str, version: int, exclude: set[str]) -> str | None:
        """The replica to send a call to (see ``choice.choose``), or None: use the queue group."""
        candidates = [r for r in self.loads.fresh(app, function, version)
                      if r.replica_id not in exclude and self._serves(r.replica_id, app)]
        return choose(candidates, self._sent)

    def _serves(self, replica_id: str, app: str) -> bool:
        """Whether a replica reported on ``app``'s stats subject runs and is ``app``'s: a replica may publish there
        naming any replica id, and one naming another tenant's replica drew its app's calls to it (where that
        replica's function of the same name ran them)."""
        return self._alive(replica_id) and (self._replica_of is None or self._replica_of(replica_id, app))

    def choose_stream(self, app: str, function: str, version: int, exclude: set[str]) -> str | None:
        """The replica to send a new stream to (see ``choice.fewest_running``), or None: use the queue group."""
        candidates = [r for r in self.loads.fresh(app, function, version)
                      if r.replica_id not in exclude and self._serves(r.replica_id, app)]
        return fewest_running(candidates, self.streams_on, unreported=self.unreported)

    async def call(self, app: str, function: str, version: int, body: bytes, *, call_id: str,
                   deadline: float, chain: list[Hop] | None = None, packed: bool = False,
                   compact: bool = False) -> Answer:
        """Send the call and wait for its answer; if this is cancelled (the caller went away) or fails once a replica
        took it (its deadline passed), the replica holding the call is told to drop it, and the calls it made through
        the relay end with it (``lineage.announce``). ``chain``: the calls waiting on this one (a call between
        functions). ``packed``: ``body`` is msgpack, and the call travels in a msgpack frame (its answer's output is
        msgpack too; ``compact``: arrays in it as compact tensors)."""
        group_subject = subjects.invoke(app, function, version)
        tried: set[str] = set()
        trace = tracing.current_headers({"ember.call_id": call_id}) if tracing.ON else _UNTRACED
        pending = _Pending(f"{app}.{function}", Invocation(call_id=call_id, function=function, deadline=deadline,
                                                           input=msgspec.Raw(body), chain=chain or [],
                                                           compact=compact, trace=trace), packed=packed)
        self._waiting[call_id] = pending
        load_key = (app, function.split(".")[0])
        self.received[load_key] += 1
        self.in_flight[load_key] += 1
        try:
            attempts = 0
            while True:
                target = self.choose(app, function, version, tried)
                if target is None and not attempts:
                    self.on_unserved(*load_key)
                self._send(subjects.replica_invoke(target) if target else group_subject, pending)
                attempts += 1
                pending.sent_to = target or ""
                if target:
                    self._sent[target] += 1
                try:
                    answer = await self._attempt(pending)
                    pending.answered = True
                    return answer
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
                    self._leave_frame(pending)
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
                await asyncio.shield(self._cancel(app, holder, call_id))

    def _send(self, subject: str, pending: _Pending) -> None:
        """Queue the call for ``subject``; the frames go out once the calls of this turn of the loop are in."""
        (self._packed if pending.packed else self._outbox).put(subject, pending)
        pending.queued = True

    def _packed_frame(self, outbox: dict[str, list[_Pending]]) -> Coroutine[Any, Any, None] | None:
        return self._frame(outbox, packed_encoder)

    def _frame(self, outbox: dict[str, list[_Pending]],
               codec: msgspec.json.Encoder | msgspec.msgpack.Encoder = encoder) -> Coroutine[Any, Any, None] | None:
        """The calls of one turn of the loop, in frames (JSON, or msgpack with ``packed_encoder``); the coroutine
        that sends them."""
        frames = []
        for subject, queued in outbox.items():
            calls = [p for p in queued if p.queued]  # not those whose caller left before this
            sizes = [len(p.invocation.input) for p in calls]
            for frame in split_frames(calls, sizes, self._nc.max_payload) if calls else ():
                frame_id = f"{frame[0].what.partition('.')[0]}.{secrets.token_hex(8)}"  # <app>.<unguessable>
                self._frames[frame_id] = _Frame(frame, len(frame))
                for pending in frame:
                    pending.queued, pending.frame = False, frame_id
                frames.append((subject, frame_id, codec.encode([p.invocation for p in frame])))
        return self._publish(frames) if frames else None

    async def _publish(self, frames: list[tuple[str, str, bytes]]) -> None:
        for subject, frame_id, data in frames:
            try:
                await self._nc.publish(subject, data, reply=f"{self._inbox}.{frame_id}")
            except Exception as exc:  # NATS is down or refuses the message: a 503 the client may retry
                for pending in self._in_frame(frame_id):
                    pending.fail(UnavailableError(f"could not send the call to {pending.what}: {exc}",
                                                  retry_after_s=1.0, call_id=pending.invocation.call_id))

    def _in_frame(self, frame_id: str) -> list[_Pending]:
        """The calls whose current attempt went out in this frame."""
        frame = self._frames.get(frame_id)
        return [p for p in frame.calls if p.frame == frame_id] if frame else []

    def _leave_frame(self, pending: _Pending) -> None:
        """The call's attempt is over: it is no longer counted as waiting in the frame that carried it."""
        pending.queued = False
        frame = self._frames.get(pending.frame)
        if frame is not None:
            frame.waiting -= 1
            if not frame.waiting:
                del self._frames[pending.frame]
        pending.frame = ""

    async def _on_answers(self, msg: Msg) -> None:
        if msg.headers and msg.headers.get("Status") == "503":  # no responders: no replica is subscribed yet
            for pending in self._in_frame(msg.subject[len(self._inbox) + 1:]):
                pending.deliver(NO_RESPONDERS)
            return
        try:
            answers = (answers_decoder if is_json_frame(msg.data) else packed_answers_decoder).decode(msg.data)
        except Exception as exc:  # the calls are resent when no answer comes
            log.warning("undecodable answers on %s: %s", msg.subject, exc)
            return
        frame_id = msg.subject[len(self._inbox) + 1:]
        for answer in answers:
            waiting = self._waiting.get(answer.call_id)
            if waiting is not None and waiting.frame == frame_id:  # only the replica sent the call answers it
                waiting.deliver(answer)

    async def _cancel(self, app: str, replica_id: str, call_id: str) -> None:
        try:
            await self._nc.publish(subjects.replica_cancel(replica_id), call_id.encode())
        except Exception as exc:  # the call is abandoned either way; the replica drops it at its deadline
            log.warning("could not cancel call %s on %s: %s", call_id, replica_id, exc)
        await lineage.announce(self._nc, app, call_id)

    async def _attempt(self, pending: _Pending) -> Answer:
        ack_by = time.monotonic() + ACK_TIMEOUT_S  # a replica that took the call acknowledges (or answers) it by then
        while True:
            remaining = pending.invocation.deadline - time.time()
            if remaining <= 0:
                if pending.unreached:  # the last try found no replica subscribed: none is ready (a cold start)
                    raise UnavailableError(f"no replica of {pending.what} became ready before the deadline",
                                           retry_after_s=1.0, call_id=pending.invocation.call_id)
                raise DeadlineExceededError(f"{pending.what} did not answer within its deadline",
                                            call_id=pending.invocation.call_id)
            # The replica that holds the call, or that it was sent to, is watched: once it is known dead (crashed,
            # removed, silent), the call goes elsewhere, acknowledged or not (a send to the group names no replica:
            # only its acknowledgement's timeout tells)
            watched = pending.holder or pending.sent_to
            wait = min(remaining, LIVENESS_CHECK_S if pending.holder else UNACKED_CHECK_S if watched else ACK_TIMEOUT_S)
            try:
                answer = await pending.next(wait)
            except TimeoutError:
                if watched and not self._alive(watched):
                    raise _Retry(f"replica {watched} died " + ("while holding the call" if pending.holder else
                                                               "before acknowledging the call")) from None
                if not pending.holder and remaining > wait and time.monotonic() >= ack_by:
                    raise _Retry("no replica acknowledged the call") from None
                continue
            if answer is NO_RESPONDERS:
                pending.unreached = True
                await asyncio.sleep(min(NO_REPLICA_POLL_S, max(remaining, 0)))
                raise _Retry("no responders", counts=False)
            assert isinstance(answer, Answer)
            pending.unreached = False
            if answer.ack:
                pending.holder = answer.ack
                continue
            if answer.error is not None and answer.error.code == UnavailableError.code and not answer.error.type:
                # (with a ``type``, the function raised it, or let it out of a call it made: it ran; not sent again)
                raise _Retry(f"replica {pending.holder or '?'} is shutting down")  # it never ran the call
            return answer


@dataclass
class _Frame:
    calls: list[_Pending]
    waiting: int  # calls of this frame not yet answered, retried elsewhere or given up


@dataclass
class _Pending:
    """One call in flight: its invocation, the answers that arrived for it, which replica holds it (once acked),
    which one it was last sent to (empty for the queue group) and in which frame.

    Waiting is a bare future and a timer rather than ``asyncio.Queue`` and ``wait_for``: this runs for every
    synchronous call, and ``wait_for`` costs a task per wait."""

    what: str
    invocation: Invocation
    packed: bool = False  # travels in msgpack frames
    holder: str = ""
    sent_to: str = ""
    queued: bool = False  # in the outbox: its frame has not been sent yet
    frame: str = ""  # the frame of its current attempt, once sent
    answered: bool = False
    unreached: bool = False  # its last try found no replica subscribed (503 at the deadline, not 504)
    _inbox: deque[Answer | _NoResponders | BaseException] = field(default_factory=deque)
    _waiter: asyncio.Future[Answer | _NoResponders] | None = None

    def deliver(self, item: Answer | _NoResponders) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(item)
        else:
            self._inbox.append(item)

    def fail(self, exc: BaseException) -> None:
        """The frame carrying this call could not be sent: ``next`` raises ``exc``."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        else:
            self._inbox.append(exc)

    async def next(self, timeout: float) -> Answer | _NoResponders:
        """The next answer (or ack) for this call; ``TimeoutError`` after ``timeout`` seconds without one."""
        if self._inbox:
            item = self._inbox.popleft()
            if isinstance(item, BaseException):
                raise item
            return item
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, _expire, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiter = None


def _expire(waiter: asyncio.Future[Answer | _NoResponders]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
