"""Asynchronous calls on the platform side: submit to the JetStream work queue, read, wait, cancel,
dead letters and replay. Replicas pull and answer them (``ember_runtime.replica.queue_worker``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError as JsAPIError
from nats.js.errors import NotFoundError as JsNotFound

from ember import _tracing as tracing
from ember._errors import (
    BadRequestError,
    ConflictError,
    EmberError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
)
from ember.wire import (
    CALL_ID_HEADER,
    DEADLINE_HEADER,
    FINAL_STATUSES,
    CallRecord,
    DeadLetter,
    ErrorInfo,
    Manifest,
    SpawnReply,
    subjects,
)
from ember.wire.atomic import Message, atomic_allowed, try_atomic
from ember.wire.calls import MAX_REPLAY
from ember.wire.callstore import CallStore, app_of, final, new_call_id
from ember.wire.headers import CREATED_AT_HEADER, INPUT_SHA256_HEADER, TERMINATE_HEADER
from ember.wire.jetstream import DUPLICATE_WINDOW_S, StorageLimits, Stores, js_replicas, kv_stream, reserving
from ember_platform.calls import lineage, retire
from ember_platform.calls.retire import CALL_ID as CALL_ID  # the rule of a call id, as the API documents it
from ember_platform.calls.retire import MAX_CALL_ID, NO_SUCH_SEQUENCE, Spare
from ember_platform.calls.shares import QueueShares, Ticket

SUBMIT_BATCH = 250  # calls per atomic batch of submit_many (at most MAX_BATCH): smaller, the first are queued sooner
_dead_decoder = msgspec.json.Decoder(DeadLetter)
_SUBMIT_RETRY_AFTER_S = 1.0  # when a submit's publish failed
_WINDOW_MARGIN_S = 10.0  # a repeated submit this close to the end of the duplicate window publishes nothing again
_WAIT_POLL_S = (0.02, 0.5)  # first and longest pause between reads while long-polling

DEAD_PAGE, MAX_DEAD_PAGE = 100, 1000  # dead letters per read: by default, and at most


class Submission(msgspec.Struct, frozen=True):
    """A call ``Calls.submit_many`` queues: its id and ``Nats-Msg-Id`` chosen by the caller (a scheduled tick's)."""

    app: str
    function: str
    call_id: str
    msg_id: str
    body: bytes = b"{}"


async def _into(replies: list[SpawnReply | EmberError | None], k: int, submitted: Awaitable[SpawnReply]) -> None:
    """``replies[k]``: what ``submitted`` answers, or the ``EmberError`` that kept it from being queued."""
    try:
        replies[k] = await submitted
    except EmberError as exc:
        replies[k] = exc


def check_call_id(call_id: str) -> str:
    """``call_id`` if it can name a call; ``BadRequestError`` (field ``call_id``) before it reaches NATS if not."""
    if not retire.is_call_id(call_id):
        shown = call_id if len(call_id) <= 80 else call_id[:80] + "..."
        raise BadRequestError(f"{shown!r} is not a call id (1 to {MAX_CALL_ID} of A-Z a-z 0-9 - _ = / and "
                              f"'.' between them)", field="call_id")
    return call_id


def _may_be_unpublished(existing: CallRecord, now: float) -> bool:
    """Whether a submit repeating ``existing``'s (its idempotency key, a schedule's tick) publishes its message again.

    Only a call still ``queued`` within JetStream's duplicate window: its first submit may have recorded it and died
    before its publish (a message sent again is then the only one), and if the first message was stored, the one sent
    again is dropped as its duplicate (the same ``Nats-Msg-Id``). A call that runs was taken from the queue already,
    and past the window a second message would be stored beside the first: both would run. (A submit that died
    between its record and its publish, repeated only after the window, finds its call queued for good.)"""
    return existing.status == "queued" and now - existing.created_at < DUPLICATE_WINDOW_S - _WINDOW_MARGIN_S


class Calls:
    def __init__(self, nc: Client, stores: Stores, ack_wait_s: float,
                 event_app: Callable[[str], str | None] = lambda _scope: None,
                 limits: StorageLimits | None = None) -> None:
        """``event_app``: the app whose function's event stream has a scope (``subjects.event_scope``), from what
        is deployed: an event call's id names its function by that scope only. ``limits``: those of the event
        streams and of each app's share of the calls' queue (``StorageLimits.from_env()`` when not given)."""
        self._event_app = event_app
        limits = limits or StorageLimits.from_env()
        self._event_limits = limits.events()
        self._nc = nc
        self._js = nc.jetstream()
        self.shares = QueueShares(self._js, limits)
        self.store = CallStore(self._js, stores.calls, stores.results)
        self._atomic: bool | None = None  # whether the statuses' and the queue's streams take atomic batches
        self._ack_wait_s = ack_wait_s

    # -- deployment ----------------------------------------------------------------------------------

    async def ensure_consumers(self, manifest: Manifest, only: Collection[str] | None = None) -> None:
        """One durable pull consumer per function (those named in ``only``, if given), filtered on its subject
        (filters never overlap), and for a function bound to events, a work-queue stream of its subjects with a
        consumer too."""
        for svc in manifest.services:
            for fn in svc.functions:
                if only is not None and fn.name not in only:
                    continue
                await self._js.add_consumer(subjects.CALLS_STREAM, self._consumer(
                    manifest.app, fn.name, subjects.calls(manifest.app, fn.name)))
                if fn.on:
                    await self._ensure_events(manifest.app, fn.name, fn.on)

    def _consumer(self, app: str, function: str, filter_subject: str | None, name: str = "") -> ConsumerConfig:
        return ConsumerConfig(durable_name=name or subjects.calls_consumer(app, function),
                              filter_subject=filter_subject, ack_policy=AckPolicy.EXPLICIT, ack_wait=self._ack_wait_s,
                              max_deliver=-1, max_ack_pending=20_000)

    async def ensure_pinned(self, manifest: Manifest, version: int) -> None:
        """One durable pull consumer per function of ``version`` for the calls spawned pinned to it, which only that
        version's replicas pull."""
        for svc in manifest.services:
            for fn in svc.functions:
                await self._js.add_consumer(subjects.CALLS_STREAM, self._consumer(
                    manifest.app, fn.name, subjects.pinned_calls(manifest.app, fn.name, version),
                    subjects.pinned_calls_consumer(manifest.app, fn.name, version)))

    async def remove_pinned(self, manifest: Manifest, version: int) -> None:
        """Drop a version's pinned queues (a version no longer kept): what waits there is cancelled first."""
        for svc in manifest.services:
            for fn in svc.functions:
                await retire.delete_consumer(self._js, subjects.CALLS_STREAM,
                                             subjects.pinned_calls_consumer(manifest.app, fn.name, version))
                why = f"version {version} of the app {manifest.app!r} is no longer kept before the call finished"
                await retire.cancel_waiting(self._js, self.store, manifest.app,
                                            subjects.pinned_calls(manifest.app, fn.name, version), why)

    async def pinned_backlog(self, app: str, function: str, version: int) -> int:
        """Calls pinned to ``version`` of ``app.function`` that wait or run (0 when there is no such queue)."""
        try:
            info = await self._js.consumer_info(subjects.CALLS_STREAM,
                                                subjects.pinned_calls_consumer(app, function, version))
        except JsNotFound:
            return 0
        return (info.num_pending or 0) + (info.num_ack_pending or 0)

    async def _ensure_events(self, app: str, function: str, on: list[str]) -> None:
        """The function's event stream takes ``on``, bounded by the event streams' limits (a full one refuses new
        events: nothing waiting is dropped) and held by as many servers as every other stream."""
        name = subjects.events_stream(app, function)
        config = StreamConfig(name=name, subjects=on, retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE,
                              duplicate_window=DUPLICATE_WINDOW_S, num_replicas=js_replicas(), **self._event_limits)
        try:
            try:
                await self._js.stream_info(name)
                made = self._js.update_stream
            except JsNotFound:
                made = self._js.add_stream
            await reserving(name, config.max_bytes or -1, lambda max_bytes: made(config.evolve(max_bytes=max_bytes)))
        except JsAPIError as exc:
            raise InvalidInputError(f"{app}.{function} cannot bind to {on}: {exc.description}",
                                    field="$.manifest.services[].functions[].on") from exc
        except RuntimeError as exc:  # not even the smallest max_bytes could be reserved: the server's disk is full
            raise UnavailableError(f"{app}.{function} cannot bind to {on} now: {exc}", retry_after_s=60.0) from exc
        await self._js.add_consumer(name, self._consumer(app, function, None))

    async def remove(self, app: str, manifests: Collection[Manifest]) -> None:
        """Drop every queue of a deleted app: its event streams (those of the functions of ``manifests``, its
        versions kept), every consumer that takes its calls, and each call waiting in any of its queues (of every
        function it ever had, pinned to a version or not), marked ``cancelled`` first, saying that the app was
        deleted: no record stays "queued" until it expires; and its dead letters (their inputs: whoever deploys an app
        of that name next would read and replay them). Never another app's queues. Final records are kept (they
        expire with the bucket's TTL)."""
        for name in sorted({fn.name for m in manifests for svc in m.services for fn in svc.functions if fn.on}):
            with contextlib.suppress(JsNotFound):
                await self._js.delete_stream(subjects.events_stream(app, name))
        for consumer in await retire.consumers_of(self._js, app):
            await retire.delete_consumer(self._js, subjects.CALLS_STREAM, consumer)
        await retire.cancel_waiting(self._js, self.store, app, retire.app_queues(app),
                                    f"the app {app!r} was deleted before the call finished")
        with contextlib.suppress(JsNotFound):
            await self._js.purge_stream(subjects.DEAD_STREAM, subject=subjects.dead_of_app(app))
        self.shares.forget(app)

    async def retire_function(self, app: str, function: str, reason: str, *, spare: Spare | None = None,
                              events: bool = False) -> retire.Walked:
        """Drop the own queue of a function that no version taking calls has any more: its consumer (and its event
        stream, with ``events``), then each call waiting there, ``cancelled`` with ``reason`` (those ``spare`` keeps
        stay, with their messages)."""
        await retire.delete_consumer(self._js, subjects.CALLS_STREAM, subjects.calls_consumer(app, function))
        if events:
            with contextlib.suppress(JsNotFound):
                await self._js.delete_stream(subjects.events_stream(app, function))
        return await retire.cancel_waiting(self._js, self.store, app, subjects.calls(app, function), reason,
                                           spare)

    async def functions_waiting(self, app: str) -> set[str]:
        """The functions of ``app`` whose own queue holds calls (one stream info)."""
        return await retire.waiting_functions(self._js, app)

    # -- calls ---------------------------------------------------------------------------------------

    async def submit(self, app: str, function: str, body: bytes, *, key: str | None, deadline: float,
                     version: int | None = None, call_id: str = "", msg_id: str = "",
                     admitted: Ticket | None = None) -> SpawnReply:
        """Queue a call under a new random id. An idempotency ``key`` maps to a call id per app in KV (the first
        writer wins; the id is random, not derived from the key): a repeated submit of the same body returns the
        first call's id and the call is stored once (the id is also the message's ``Nats-Msg-Id``, deduplicated by
        JetStream); the same key with another body or function is a ``ConflictError`` (the record keeps the sha256
        of the first body). With ``version`` the call waits in that version's pinned queue, which only its replicas
        pull.

        A publish that fails (NATS unreachable, no ack in time) removes the status this submit created, so that no
        "queued" record waits for a message that never came, and is an ``UnavailableError`` (503, Retry-After):
        retrying is safe with an Idempotency-Key (if the message was stored after all, the retry's publish is
        deduplicated by its ``Nats-Msg-Id``; a message whose status is gone runs with a record made anew).

        ``call_id`` and ``msg_id``: a scheduled tick's (``ember.wire.schedules``), the same on every control plane,
        so that a tick submitted twice (a failover, two control planes) is recorded and queued once.

        The call counts against its app's share of the queue first (``QueueShares.admit``: past it, an
        ``OverloadedError``, 429), unless ``admitted`` says it was counted."""
        ticket = admitted if admitted is not None else await self.shares.admit(app, function, version, len(body))
        try:
            reply, seq = await self._submit(app, function, body, key, deadline, version, call_id, msg_id)
        except BaseException:
            self.shares.release(ticket)
            raise
        if reply.created and seq is not None:
            self.shares.queued(ticket, seq)
        else:
            self.shares.release(ticket)
        return reply

    async def _submit(self, app: str, function: str, body: bytes, key: str | None, deadline: float,
                      version: int | None, call_id: str, msg_id: str) -> tuple[SpawnReply, int | None]:
        """``submit``'s work: the reply, and the stream sequence of the message it queued (None: none)."""
        call_id = call_id or new_call_id(app)
        digest = hashlib.sha256(body).hexdigest() if key is not None else ""
        now = time.time()
        try:
            if key is not None:
                call_id = await self.store.call_id_for_key(app, _key_hash(app, key), call_id)
            existing = await self.store.create_status(CallRecord(call_id=call_id, app=app, function=function,
                                                                 status="queued", created_at=now, updated_at=now,
                                                                 input_sha256=digest))
        except (NatsError, OSError, TimeoutError) as exc:  # NATS unreachable, or the records bucket is full
            raise UnavailableError(f"the call to {app}.{function} could not be recorded ({type(exc).__name__}: "
                                   f"{exc}); retry shortly", retry_after_s=_SUBMIT_RETRY_AFTER_S) from exc
        if existing is not None and ((existing.input_sha256 and existing.input_sha256 != digest)
                                     or existing.function != function):
            raise ConflictError(f"this Idempotency-Key was used with another body or function in app {app!r} (call "
                                f"{call_id}, {existing.function}); a new input needs a new key",
                                field="Idempotency-Key")
        if existing is not None and not _may_be_unpublished(existing, now):  # final, taken, or queued for long
            return SpawnReply(call_id=call_id, status=existing.status, created=False), None
        seq = await self._enqueue(app, function, body, call_id, msg_id, deadline, version, created=existing is None,
                                  created_at=existing.created_at if existing else now, input_sha256=digest)
        return SpawnReply(call_id=call_id, status=existing.status if existing else "queued",
                          created=existing is None), seq

    def _message(self, app: str, function: str, body: bytes, call_id: str, msg_id: str, deadline: float,
                 version: int | None, created_at: float, input_sha256: str = "") -> Message:
        """A call's message on its queue: subject, body, headers (what its status said when it was queued, too)."""
        headers = {"Nats-Msg-Id": msg_id or call_id, CALL_ID_HEADER: call_id, CREATED_AT_HEADER: repr(created_at)}
        if input_sha256:
            headers[INPUT_SHA256_HEADER] = input_sha256
        if tracing.ON:  # the spawn's span: the replica's span of the call is its child
            headers.update(tracing.current_headers({"ember.call_id": call_id}))
        if math.isfinite(deadline):
            headers[DEADLINE_HEADER] = repr(deadline)
        subject = subjects.calls(app, function) if version is None else subjects.pinned_calls(app, function, version)
        return subject, body, headers

    async def _enqueue(self, app: str, function: str, body: bytes, call_id: str, msg_id: str, deadline: float,
                       version: int | None, *, created: bool, created_at: float, input_sha256: str = "") -> int:
        """Publish a recorded call's message (its stream sequence); if that fails, the status this submit
        ``created`` is removed."""
        subject, body, headers = self._message(app, function, body, call_id, msg_id, deadline, version, created_at,
                                               input_sha256)
        try:
            return int((await self._js.publish(subject, body, headers=headers)).seq)
        except (NatsError, OSError, TimeoutError) as exc:
            if created:
                with contextlib.suppress(NatsError, OSError, TimeoutError):
                    await self.store.forget(app, call_id)
            raise UnavailableError(f"the call to {app}.{function} could not be queued ({type(exc).__name__}: "
                                   f"{exc}); retry shortly", retry_after_s=_SUBMIT_RETRY_AFTER_S) from exc

    async def submit_many(self, ticks: list[Submission]) -> list[SpawnReply | EmberError]:
        """Queue many calls at once (the schedule loop's ticks, each with its call id and ``Nats-Msg-Id``): their
        statuses in atomic batches of ``ember_calls``, then their messages in atomic batches of the queue, where
        both streams take batches (``ember.wire.atomic``); what a batch did not store goes one by one as ``submit``
        does (a status already there is found, a message already queued is deduplicated by its ``Nats-Msg-Id``).
        Each submission's reply, or the error that kept it from being queued, in order."""
        replies: list[SpawnReply | EmberError | None] = [None] * len(ticks)
        tickets: list[Ticket | None] = [None] * len(ticks)
        await self.shares.prepare({t.app for t in ticks})
        try:
            for k, t in enumerate(ticks):  # each counts against its app's share first; past it, its reply is a 429
                try:
                    tickets[k] = await self.shares.admit(t.app, t.function, None, len(t.body))
                except EmberError as exc:
                    replies[k] = exc
            await self._submit_many(ticks, replies, tickets)
        finally:  # those not handed on (an error, or this task cancelled): never queued by this submit
            for ticket in tickets:
                self.shares.release(ticket)
        return replies  # type: ignore[return-value]

    async def _submit_many(self, ticks: list[Submission], replies: list[SpawnReply | EmberError | None],
                           tickets: list[Ticket | None]) -> None:
        """``submit_many`` of the ticks admitted (``replies[k]`` None); each ticket handed on leaves ``tickets``."""
        def handed(k: int) -> Ticket | None:  # taken by the code that settles it, once it runs
            ticket, tickets[k] = tickets[k], None
            return ticket

        if ticks and await self._batches():
            now = time.time()
            for start in range(0, len(ticks), SUBMIT_BATCH):  # the first runs start while the rest wait
                chunk = [k for k in range(start, min(start + SUBMIT_BATCH, len(ticks))) if replies[k] is None]
                if not chunk:
                    continue
                statuses = [CallRecord(call_id=ticks[k].call_id, app=ticks[k].app, function=ticks[k].function,
                                       status="queued", created_at=now, updated_at=now) for k in chunk]
                if await try_atomic(self._js, [self.store.create_status_message(r) for r in statuses],
                                    "statuses") is None:
                    continue  # one by one, below
                messages = [self._message(t.app, t.function, t.body, t.call_id, t.msg_id, math.inf, None, now)
                            for t in (ticks[k] for k in chunk)]
                last = await try_atomic(self._js, messages, "calls")
                if last is not None:
                    for n, k in enumerate(chunk):  # stored in order, the last at ``last``
                        replies[k] = SpawnReply(call_id=ticks[k].call_id, status="queued", created=True)
                        self.shares.queued(handed(k), last - len(chunk) + 1 + n)
                else:  # their statuses are this submit's own: published one by one, each removed if that fails
                    await asyncio.gather(*(_into(replies, k, self._enqueued(ticks[k], functools.partial(handed, k)))
                                           for k in chunk))

        async def alone(t: Submission, k: int) -> SpawnReply:
            return await self.submit(t.app, t.function, t.body, key=None, deadline=math.inf, call_id=t.call_id,
                                     msg_id=t.msg_id, admitted=handed(k))

        await asyncio.gather(*(_into(replies, k, alone(t, k)) for k, t in enumerate(ticks) if replies[k] is None))

    async def _enqueued(self, tick: Submission, take: Callable[[], Ticket | None]) -> SpawnReply:
        """The message of a tick whose status this submit recorded, published alone (its ticket ``take``n here)."""
        ticket = take()
        try:
            seq = await self._enqueue(tick.app, tick.function, tick.body, tick.call_id, tick.msg_id, math.inf, None,
                                      created=True, created_at=time.time())
        except BaseException:
            self.shares.release(ticket)
            raise
        self.shares.queued(ticket, seq)
        return SpawnReply(call_id=tick.call_id, status="queued", created=True)

    async def _batches(self) -> bool:
        """Whether the statuses' and the queue's streams take atomic batches (asked once; the control plane allows
        them at its start)."""
        if self._atomic is None:
            self._atomic = all(await asyncio.gather(atomic_allowed(self._js, kv_stream(subjects.CALLS_BUCKET)),
                                                    atomic_allowed(self._js, subjects.CALLS_STREAM)))
        return self._atomic

    async def get(self, call_id: str, wait_s: float = 0.0) -> CallRecord:
        """The call's record; with ``wait_s``, long-poll until it is final or the wait ends."""
        check_call_id(call_id)
        give_up = time.monotonic() + wait_s
        pause = _WAIT_POLL_S[0]
        while True:
            app = app_of(call_id, self._event_app)
            record = await self.store.get(app, call_id) if app is not None else None
            if record is None:
                raise no_such_call(call_id)
            if record.status in FINAL_STATUSES or time.monotonic() >= give_up:
                return record
            await asyncio.sleep(min(pause, max(give_up - time.monotonic(), 0)))
            pause = min(pause * 2, _WAIT_POLL_S[1])

    async def cancel(self, call_id: str, *, by: str = "", terminate: bool = False) -> CallRecord:
        """Cancel a call that waits or runs; ``ConflictError`` once it has finished. ``by``: who cancels (kept in
        the record, with when).

        The record is made final first (first writer wins: a replica finishing the call at the same moment wins or
        loses as a whole, and a loser's result is dropped). A call that runs is then told where it runs: its
        replica (named in its record) cancels it (``ember_runtime.replica.process``), with ``terminate`` gives way to
        a replacement, and every control plane's relay cancels the calls it made (``lineage``). A replica acts only
        on a call it holds, so a record naming another replica moves nothing there."""
        record = await self.get(call_id)
        if record.status in FINAL_STATUSES:
            raise ConflictError(f"call {call_id} is {record.status} already; only a queued or running call can be "
                                "cancelled")
        now = time.time()
        error = ErrorInfo(code="cancelled", message=f"cancelled{f' by {by}' if by else ''} while {record.status}",
                          call_id=call_id)
        cancelled = msgspec.structs.replace(final(record, "cancelled", error=error), cancelled_by=by,
                                            cancelled_at=now)
        if not await self.store.finish(cancelled):
            raise ConflictError(f"call {call_id} finished before it could be cancelled")
        running = await self.store.status(record.app, call_id)  # it may have started since it was read
        await self.store.set_status(cancelled)
        replica = running.replica if running is not None and running.status == "running" else ""
        if replica:  # written by a replica of the app: a subject token, or nothing is sent
            headers = {TERMINATE_HEADER: "1"} if terminate else None
            with contextlib.suppress(NatsError, OSError, ValueError):
                await self._nc.publish(subjects.replica_cancel(replica), call_id.encode(), headers=headers)
        await lineage.announce(self._nc, record.app, call_id)
        return cancelled

    # -- dead letters --------------------------------------------------------------------------------

    async def dead_letters(self, app: str, function: str | None, *, limit: int = DEAD_PAGE,
                           after: int = 0) -> list[tuple[int, DeadLetter]]:
        """(stream sequence, letter) of an app's dead letters, oldest first: at most ``limit`` of them, those
        after the stream sequence ``after`` (the cursor: the last sequence of the page before). Each letter is
        read by a direct get of the next message on the subject, so a read creates no consumer."""
        if not 0 < limit <= MAX_DEAD_PAGE:
            raise BadRequestError(f"limit is 1 to {MAX_DEAD_PAGE}", field="limit")
        if after < 0:
            raise BadRequestError("after is a stream sequence, 0 or more", field="after")
        subject = subjects.dead(app, function) if function else subjects.dead_of_app(app)
        letters: list[tuple[int, DeadLetter]] = []
        seq = after + 1
        while len(letters) < limit:
            try:
                msg = await self._js.get_msg(subjects.DEAD_STREAM, seq=seq, subject=subject, next=True)
            except JsNotFound:
                break
            seq = (msg.seq or seq) + 1
            with contextlib.suppress(msgspec.DecodeError):
                letters.append((seq - 1, msgspec.structs.replace(_dead_decoder.decode(msg.data or b""),
                                                                 seq=seq - 1)))
        return letters

    async def replay(self, app: str, function: str, call_ids: list[str] | None,
                     admit: Callable[[], Any] = lambda: None) -> list[str]:
        """Resubmit dead letters as new calls and remove them from the dead letters: those there when the replay
        began (a replayed call that fails again is a new letter, for a later replay: read on, the replay of a call
        that always fails never ended), ``MAX_REPLAY`` at most, each admitted by the app's quotas (``admit``: its
        ``Held``, or ``OverloadedError``) as a spawn is.

        Idempotent: the new call's id is derived from the letter (its stream sequence and call id), and is
        submitted as with an Idempotency-Key (a ``create`` of its record, a ``Nats-Msg-Id`` on its message), so
        replays that race, or one retried after a failure, queue it once; then the letter is deleted (a letter
        already deleted by the other replay is no error). Both answer the same new id."""
        wanted = set(call_ids) if call_ids is not None else None
        last = (await self._js.stream_info(subjects.DEAD_STREAM)).state.last_seq
        replayed: list[str] = []
        after = 0
        while len(replayed) < MAX_REPLAY and (page := await self.dead_letters(app, function, limit=MAX_DEAD_PAGE,
                                                                              after=after)):
            after = page[-1][0]
            for seq, letter in page:
                if seq > last or len(replayed) >= MAX_REPLAY:
                    return replayed
                if wanted is not None and letter.call_id not in wanted:
                    continue
                key = f"\0replay\0{seq}\0{letter.call_id}"  # no Idempotency-Key header holds a NUL
                held = admit()
                try:
                    reply = await self.submit(app, function, bytes(letter.input), key=key, deadline=math.inf)
                finally:
                    if held is not None:
                        held.release()
                try:
                    await self._js.delete_msg(subjects.DEAD_STREAM, seq)
                except JsAPIError as exc:
                    if exc.err_code not in NO_SUCH_SEQUENCE:  # not deleted by a replay racing this one
                        raise
                replayed.append(reply.call_id)
        return replayed


def no_such_call(call_id: str) -> NotFoundError:
    """The 404 of an unknown call; a call of an app the caller may not see gets it too."""
    return NotFoundError(f"no call {call_id!r} (unknown, or older than the results' retention)")


def _key_hash(app: str, key: str) -> str:
    """Where an idempotency key of ``app`` is kept: a digest, since a key may hold any character."""
    return hashlib.sha256(f"{app}\0{key}".encode()).hexdigest()
