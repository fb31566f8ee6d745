"""A replica's worker for one function's durable queue (JetStream work queue, durable pull consumer).

It pulls only as many calls as the batcher has room for and feeds them in as ``batch``-priority calls,
so interactive HTTP traffic goes first. While a call is held (queued or running) its message is kept
alive with in-progress acks, for as long as it is held: a draining replica has stopped pulling, yet finishes
what it holds, and a call longer than AckWait still runs once. The result is stored first (first writer wins),
then the message is acked. Only the replica's own refusal (it could not run the call: shutting down) sends the
call back at once; an error of the call's run, the function's own or one it let out of a call it made (an
``unavailable`` from ``.remote()``, say), is retried with backoff (nak with a delay) until the function's
retries are spent, then the call fails and goes to the dead letters. A replica that stops naks what it still
holds, for prompt redelivery. A message's headers are checked before use (``event_headers``: which call it is, its
deadline, where an event's result goes); one whose headers are wrong is failed and dead-lettered at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError

from ember import _tracing as tracing
from ember._errors import (
    CallCancelledError,
    DeadlineExceededError,
    EmberError,
    OverloadedError,
    RemoteError,
    UnavailableError,
)
from ember.wire import (
    CALL_ID_HEADER,
    EVENT_STATUS_HEADER,
    CallRecord,
    Retries,
    encode_output,
    encoder,
    error_info,
    subjects,
)
from ember.wire.callstore import CallStore, final, new_record
from ember.wire.headers import CREATED_AT_HEADER, INPUT_SHA256_HEADER
from ember_runtime.batching import spans
from ember_runtime.batching.batcher import Batcher, Call
from ember_runtime.replica.endpoint import Endpoint
from ember_runtime.replica.event_headers import (
    Delivery,
    default_event_id,
    event_delivery,
    event_scope,
    microseconds,
    queued_delivery,
    reply_subject,
)
from ember_runtime.replica.pulls import FETCH_WAIT_S, Puller, PullError
from ember_runtime.replica.standby import Standby

log = logging.getLogger("ember.queue")
CRASH_ALLOWANCE = 2  # deliveries beyond the retries, for replicas that died holding the call
TAKE_RETRY_S = 20.0  # how long a delivery whose take NATS failed is taken again before it is left to redelivery
_RETRYABLE = (UnavailableError.code, OverloadedError.code)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_Outcome = tuple[str, EmberError | None]  # (final status, error) of a call that was answered


class QueueWorker:
    def __init__(self, js: Any, store: CallStore, app: str, endpoint: Endpoint, batcher: Batcher,
                 retries: Retries, *, events: bool = False, pinned: int | None = None,
                 standby: Standby | None = None, replica_id: str = "") -> None:
        """``events``: the function's event stream; ``pinned``: the calls spawned pinned to this version (see
        ``subjects.pinned_calls``); neither: its queued calls. ``standby``: while held, pull nothing."""
        self._stream = subjects.events_stream(app, endpoint.spec.name) if events else subjects.CALLS_STREAM
        self._durable = (subjects.pinned_calls_consumer(app, endpoint.spec.name, pinned) if pinned is not None
                         else subjects.calls_consumer(app, endpoint.spec.name))
        self._scope = event_scope(self._stream)
        self._events = events
        self._js = js
        self._store = store
        self._app = app
        self._endpoint = endpoint
        self._batcher = batcher
        self._retries = retries
        self._held: dict[str, Msg] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._keepalive: asyncio.Task[None] | None = None  # from the first bind until ``finish``: outlives the pulls
        self._keep_every_s = 10.0
        self._puller: Puller | None = None  # the pulls' (what it holds delivered, not taken yet, is kept alive too)
        self.stop = asyncio.Event()
        self._standby = standby
        self._replica_id = replica_id  # in the running call's record: where a cancel of it goes

    @property
    def function(self) -> str:
        return self._endpoint.spec.name

    async def run(self) -> None:
        """Pull until :attr:`stop` is set, rebinding after any failure (a NATS restart, say)."""
        while not self.stop.is_set():
            try:
                await self._pull()
            except Exception:
                log.exception("queue worker of %s failed; restarting it", self.function)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 1.0)

    async def _pull(self) -> None:
        ack_wait = await self._bind()
        if ack_wait is None:
            return
        self._keep_alive_every(ack_wait / 3)
        puller = self._puller = Puller(self._js._nc, self._stream, self._durable)
        await puller.open()
        try:
            while not self.stop.is_set():
                if self._standby is not None and self._standby.held:  # a warm replica: these calls are not its own
                    await self._standby.wait_over(self.stop)
                    continue
                # Only what the batcher can start now: the rest stays in JetStream, queued and cancellable.
                room = self._batcher.vacancy
                if room <= 0:
                    self._batcher.room.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._batcher.room.wait(), FETCH_WAIT_S)
                    continue
                try:
                    msgs = await puller.pull(room, self.stop)
                except NatsTimeoutError:
                    continue
                except PullError as exc:  # the consumer changed (deleted, say): bound again once it is there
                    log.info("pulling %s ended: %s", self.function, exc)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stop.wait(), 0.5)
                    return
                except Exception as exc:  # a disconnect, say: pull again once it is back
                    log.warning("pulling %s failed: %s", self.function, exc)
                    await asyncio.sleep(0.5)
                    continue
                if self._standby is not None and self._standby.held:  # pulled as the standby began: not its own
                    await asyncio.gather(*(msg.nak() for msg in msgs), return_exceptions=True)
                    continue
                # Taken together, so that the batcher sees them at once and can batch them.
                await asyncio.gather(*(self._take_safely(msg) for msg in msgs))
        finally:  # (the calls held are kept alive still: see ``finish``)
            # delivered as the pulls stopped, to no pull: back to the queue at once, for another replica
            await asyncio.gather(*(msg.nak() for msg in await puller.close()), return_exceptions=True)

    async def finish(self) -> None:
        """After the batcher is drained: settle the answers in flight, nak anything still held. Until then the calls
        held are kept alive, though the pulls have stopped: redelivered meanwhile, a call would run twice."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._keepalive is not None:
            self._keepalive.cancel()
            await asyncio.gather(self._keepalive, return_exceptions=True)
            self._keepalive = None
        for msg in list(self._held.values()):
            with contextlib.suppress(Exception):
                await msg.nak()
        self._held.clear()

    async def hand_back(self) -> None:
        """Nak every call held now, for prompt redelivery elsewhere (a replica about to leave without draining)."""
        for msg in list(self._held.values()):
            with contextlib.suppress(Exception):
                await msg.nak()
        self._held.clear()

    async def _bind(self) -> float | None:
        """The consumer's ack wait, once it is there; None if stopped first."""
        durable = self._durable
        while not self.stop.is_set():
            try:
                info = await self._js.consumer_info(self._stream, durable)
                return float(info.config.ack_wait or 30.0)
            except Exception as exc:
                log.warning("queue %s not available yet (%s); retrying", durable, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 2.0)
        return None

    def _keep_alive_every(self, every_s: float) -> None:
        """In-progress acks for the calls held, and those delivered to the pulls and not taken yet, every ``every_s``
        (a third of the consumer's ack wait)."""
        self._keep_every_s = every_s
        if self._keepalive is None:
            self._keepalive = asyncio.create_task(self._keep_alive(), name=f"in-progress-{self.function}")

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self._keep_every_s)
            for msg in [*self._held.values(), *(self._puller.waiting() if self._puller is not None else [])]:
                with contextlib.suppress(Exception):
                    await msg.in_progress()

    async def _take_safely(self, msg: Msg) -> None:
        """Take a delivered call. Where NATS fails meanwhile (a server of the cluster lost, its streams electing a
        leader) or no control plane answers its reads (none running for a moment, one restarting), the same delivery
        is taken again, kept in progress, for up to ``TAKE_RETRY_S``: a redelivery
        would count against the call as if it had crashed its replica (``CRASH_ALLOWANCE``), and three failed
        takes in a row failed it as a poison input."""
        give_up = time.monotonic() + TAKE_RETRY_S
        pause = 0.25
        while True:
            try:
                await self._take(msg)
                return
            except (NatsError, OSError, TimeoutError, UnavailableError, OverloadedError) as exc:
                # (the relay's reads: no control plane answering, one restarting or overloaded, are passing too)
                if self.stop.is_set() or time.monotonic() + pause > give_up:
                    log.exception("could not take a call from %s; it will be redelivered", self.function)
                    return
                log.warning("could not take a call from %s (%s: %s); trying again in %.2f s", self.function,
                            type(exc).__name__, exc, pause)
                with contextlib.suppress(Exception):
                    await msg.in_progress()  # its ack wait starts again: not redelivered meanwhile
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), pause)
                if self.stop.is_set():  # leaving: another replica takes it
                    with contextlib.suppress(Exception):
                        await msg.nak()
                    return
                pause = min(pause * 2, 2.0)
            except Exception:
                log.exception("could not take a call from %s; it will be redelivered", self.function)
                return

    def _delivery(self, msg: Msg) -> Delivery:
        headers = msg.headers or {}
        seq = msg.metadata.sequence.stream
        if not self._events:
            return queued_delivery(headers, f"{self._stream.lower()}-{seq}")
        stored_at = microseconds(msg.metadata.timestamp)  # when it was stored: the same on every redelivery
        return event_delivery(headers, self._scope, default_event_id(self._scope, stored_at, seq),
                              self._endpoint.spec.result_subject, app=self._app)

    async def _take(self, msg: Msg) -> None:
        delivery = self._delivery(msg)
        call_id, deadline = delivery.call_id, delivery.deadline
        attempt = msg.metadata.num_delivered or 1
        ending = self._ending(delivery, deadline, attempt)
        if ending is None:
            try:
                value = self._endpoint.decode(msg.data)
                cost = self._endpoint.cost_of(value)
            except EmberError as exc:  # this input can never succeed
                ending = "failed", exc, True
        if ending is not None:
            status, error, dead = ending
            record = await self._store.status(self._app, call_id) or new_record(call_id, self._app, self.function)
            await self._settle(msg, msgspec.structs.replace(record, attempts=attempt), status, error=error, dead=dead)
            return
        # Marked running, then read for a final record: a cancelled or finished call is not run. A first delivery
        # writes its status from what the message says of it (the one read is over the relay); a later one has its
        # status read, kept (the last attempt's error) and written by a control plane (CallStore.take).
        if attempt == 1:
            running = self._first_run(msg, call_id)
            await self._store.set_status(running)
            finished = await self._store.has_result(self._app, call_id)
        else:
            running, finished = await self._store.take(self._app, call_id, self.function, attempt, self._replica_id)
        if finished:
            await self._repeat(msg, call_id)
            await msg.ack()
            return
        self._held[call_id] = msg
        span = self._span(msg, call_id, attempt) if tracing.ON else None
        try:
            self._batcher.submit(Call(value, deadline, self._answerer(msg, running, deadline, span), call_id, "batch",
                                      cost, span=span))
        except EmberError as exc:
            if span is not None:
                spans.answered(span, exc)
            self._held.pop(call_id, None)
            await self._store.set_status(msgspec.structs.replace(running, status="queued"))
            await msg.nak(delay=1.0)

    def _first_run(self, msg: Msg, call_id: str) -> CallRecord:
        """The running status of a call delivered for the first time, from its message: its ``created_at`` and input
        hash as the submit recorded them (headers; else when the message was stored: an event, an older platform)."""
        headers = msg.headers or {}
        try:
            created_at = float(headers.get(CREATED_AT_HEADER, "nan"))
        except ValueError:
            created_at = math.nan
        if not math.isfinite(created_at):
            created_at = microseconds(msg.metadata.timestamp) / 1e6
        digest = headers.get(INPUT_SHA256_HEADER, "")
        now = time.time()
        return CallRecord(call_id=call_id, app=self._app, function=self.function, status="running",
                          created_at=created_at, updated_at=now, started_at=now, attempts=1, replica=self._replica_id,
                          input_sha256=digest if _SHA256.fullmatch(digest) else "")

    def _ending(self, delivery: Delivery, deadline: float, attempt: int) -> tuple[str, EmberError, bool] | None:
        """How a delivery ends without running, if it does: (status, error, dead-lettered)."""
        if delivery.problem is not None:  # headers no retry can mend: settled now, never redelivered
            return "failed", delivery.problem, True
        if deadline <= time.time():
            return "expired", DeadlineExceededError("the call's deadline passed while it was queued",
                                                    call_id=delivery.call_id), False
        if attempt > self._retries.max_retries + 1 + CRASH_ALLOWANCE:
            return "failed", RemoteError(f"delivered {attempt} times without an answer: the replica may crash on "
                                         "this input", remote_type="RepeatedDelivery", call_id=delivery.call_id), True
        return None

    def _span(self, msg: Msg, call_id: str, attempt: int) -> Any:
        """The call's ``ember.call`` span: a child of the ``traceparent`` header its message came with (the spawn's
        span, or an event publisher's), from when the message was stored (its whole wait) on a first delivery."""
        now = time.time_ns()
        stored = min(microseconds(msg.metadata.timestamp) * 1000, now) if attempt == 1 else now
        return spans.call(msg.headers, call_id, self.function, kind="consumer", start_ns=stored,
                          attributes={"ember.attempt": attempt, "messaging.system": "nats",
                                      "messaging.destination.name": self._stream})

    def _answerer(self, msg: Msg, record: CallRecord, deadline: float, span: Any = None) -> Any:
        async def answer(output: Any, error: EmberError | None, batch_size: int) -> None:
            if span is not None:
                spans.answered(span, error)
            if error is not None and _refused(error, batch_size):
                work = self._requeue(msg, record)
            else:
                work = self._complete(msg, record, output, _outcome(error, deadline))
            task = asyncio.create_task(work)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return answer

    async def _requeue(self, msg: Msg, record: CallRecord) -> None:
        """Back to the queue at once, no retry spent: this replica could not run the call."""
        self._held.pop(record.call_id, None)
        try:
            await self._store.set_status(msgspec.structs.replace(record, status="queued"))
            await msg.nak(delay=0.1)
        except Exception:
            log.exception("could not requeue call %s; it will be redelivered", record.call_id)

    async def _complete(self, msg: Msg, record: CallRecord, output: Any, outcome: _Outcome) -> None:
        self._held.pop(record.call_id, None)
        status, error = outcome
        try:
            if error is None:
                try:
                    encoded = encode_output(output)
                except RemoteError as exc:
                    await self._settle(msg, record, "failed", error=exc, dead=True)
                    return
                await self._settle(msg, record, "succeeded", output=encoded)
            elif status != "failed":  # cancelled (its canceller wrote the record already) or expired
                await self._settle(msg, record, status, error=error)
            elif record.attempts <= self._retries.max_retries:
                await self._store.set_status(msgspec.structs.replace(record, status="queued", error=error_info(error)))
                await msg.nak(delay=self._retries.delay_s(record.attempts))
            else:
                await self._settle(msg, record, "failed", error=error, dead=True)
        except Exception:
            log.exception("could not settle call %s; it will be redelivered", record.call_id)

    async def _settle(self, msg: Msg, record: CallRecord, status: str, *, output: bytes = b"null",
                      error: EmberError | None = None, dead: bool = False) -> None:
        """Store the final record (first writer wins), THEN dead-letter the call if asked and publish an event's
        result, then ack the message.

        The record comes first, so that no replica ever needs to remove a dead letter (a permission over every
        app's letters): only the writer that won publishes one. A crash between the record and the ack leaves the
        message to be redelivered; the redelivery finds the record and repeats its side effects (``_repeat``), as
        does a writer that lost the record to another (a late duplicate; a cancel, which has none). Repeats are
        harmless: the dead letter is published with ``Nats-Msg-Id: dead-<call id>`` (JetStream stores it once
        within the dead stream's duplicate window; a redelivery comes after AckWait, well within it), and an
        event's result is a plain publish that a consumer deduplicates by its ``Ember-Call-Id`` header (results
        are at least once)."""
        info = error_info(error) if error is not None else None
        done = final(record, status, output=output, error=info)  # type: ignore[arg-type]
        if await self._store.finish(done):
            await self._side_effects(msg, done, dead=dead and info is not None)
        else:
            await self._repeat(msg, record.call_id)
        await msg.ack()

    async def _side_effects(self, msg: Msg, done: CallRecord, *, dead: bool) -> None:
        if dead and done.error is not None:
            await self._store.dead_letter(done, done.error, msg.data)
        if self._events:
            await self._publish_result(msg, done)

    async def _repeat(self, msg: Msg, call_id: str) -> None:
        """The side effects of the call's stored final record, for a delivery that finds one: every failure that
        ends a call here is dead-lettered (a cancel or an expiry is not). Only an event's result is published again,
        so only it is read with its output (a large one, read whole, would not fit the relay's answer)."""
        winner = await self._store.result(self._app, call_id, output=self._events)
        if winner is not None:
            await self._side_effects(msg, winner, dead=winner.status == "failed")

    async def _publish_result(self, msg: Msg, done: CallRecord) -> None:
        result_subject = self._endpoint.spec.result_subject
        target = reply_subject(msg.headers or {}, self._app, result_subject) or result_subject
        if target:
            body = bytes(done.output) if done.error is None else encoder.encode(done.error)
            await self._js._nc.publish(target, body, headers={CALL_ID_HEADER: done.call_id,
                                                              EVENT_STATUS_HEADER: done.status})


def _refused(error: EmberError, batch_size: int) -> bool:
    """Whether ``error`` is the replica's refusal to run the call (``unavailable``: it is shutting down), answered
    by the batcher before any run (``batch_size`` 0). An ``unavailable`` or ``overloaded`` that a run ended with
    is the function's own, raised or let out of a call it made (``remote_type`` says so), never a refusal."""
    return error.code in _RETRYABLE and batch_size == 0 and not error.remote_type


def _outcome(error: EmberError | None, deadline: float) -> _Outcome:
    """How a call that ran, or was dropped unrun, ends: ``cancelled`` or ``expired`` where the platform cancelled it
    or its deadline passed (an error without ``remote_type``: the batcher's, not the function's), else ``failed``
    with the function's error, under its retries (a cancel or a deadline of a call it made is its own error,
    unless its own deadline has passed too)."""
    if error is None:
        return "succeeded", None
    platform = not error.remote_type
    if error.code == CallCancelledError.code and platform:
        return "cancelled", error
    if error.code == DeadlineExceededError.code and (platform or deadline <= time.time()):
        return "expired", error
    return "failed", error
