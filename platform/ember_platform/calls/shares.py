"""Each app's share of the calls' queue: one app's spawns cannot fill the queue that every app's spawns share.

Every queued call waits in one work-queue stream (``EMBER_CALLS``, 1 GiB by default), and a full stream refuses the
next call of any app. So an app may hold at most ``EMBER_CALLS_STREAM_MAX_BYTES_PER_APP`` of input there, and
``EMBER_CALLS_STREAM_MAX_MSGS_PER_APP`` calls (a quarter of the stream's limits unless set); past them its spawns get a
429 with Retry-After, while every other app's go on.

JetStream counts an app's calls exactly (one stream info filtered on the app's queues, read at most every
``READ_EVERY_S`` per app, by one request at a time), but not their bytes. The bytes are this control plane's
upper bound: it keeps the size of every call it queued (with its message's overhead, rounded up, at most 1/8 over)
until its queue's consumer shows that it may have run, and of the calls a queue holds it counts the largest it
queued there, whichever ran meanwhile. A call it did not queue (another control plane's, or one queued before it
started) counts as the mean of the app's own calls it knows, or as the call being admitted when it knows none:
never as other apps' calls, so that neither an app of small calls nor one of large calls moves another's share. A
call admitted counts at once, before its publish, so concurrent spawns see each other. Several control planes each
admit up to the share, as quotas do; a control plane started again counts the calls queued before by the first it
admits after.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ember._errors import OverloadedError
from ember.wire import subjects
from ember.wire.jetstream import APP_SHARE, StorageLimits
from ember_platform.calls import retire

log = logging.getLogger("ember.calls")
READ_EVERY_S = 1.0  # an app's counts are read again when older than this, while its spawns wait for none
STALE_S = 5.0  # older than this (or never read), a spawn waits for the read
RECHECK_S = 0.1  # a spawn the counts would refuse waits for a read if the last is older than this
FORGET_S = 300.0  # an app that spawned nothing for this long: forgotten once a read finds it holds nothing
MESSAGE_OVERHEAD = 512  # what a queued call's message holds beside its input and subject: headers, the store's own
RETRY_AFTER_S = 5.0
_SIGNIFICANT_BITS = 4


def rounded(size: int) -> int:
    """``size`` rounded up to its four most significant bits: the ledger's sizes, at most 1/8 over."""
    step = 1 << max(0, max(size, 1).bit_length() - _SIGNIFICANT_BITS)
    return -(-max(size, 1) // step) * step


class Sizes:
    """The sizes of the calls this control plane queued on one subject: each stored one by its stream sequence until
    a read shows it may have run (``ran``), and a count per rounded size of those and of those being published (for
    the largest first, in the few hundred sizes there are)."""

    def __init__(self) -> None:
        self._stored: dict[int, int] = {}  # stream sequence -> rounded size
        self._counts: dict[int, int] = {}  # rounded size -> calls of that size, stored or being published
        self.n = 0
        self.total = 0

    def add(self, size: int) -> None:
        """A call admitted, being published."""
        size = rounded(size)
        self._counts[size] = self._counts.get(size, 0) + 1
        self.n += 1
        self.total += size

    def remove(self, size: int) -> None:
        """A call admitted that was not stored (its publish failed, or it was queued before), or one that ran."""
        size = rounded(size)
        left = self._counts.get(size, 0) - 1
        if left < 0:
            return
        if left:
            self._counts[size] = left
        else:
            del self._counts[size]
        self.n -= 1
        self.total -= size

    def stored(self, size: int, seq: int) -> None:
        """A call admitted is stored at ``seq`` (a repeated ack of one message counts it once)."""
        if seq in self._stored:
            self.remove(size)
        else:
            self._stored[seq] = rounded(size)

    def largest(self, n: int) -> int:
        """The bytes of the ``n`` largest calls (every one when ``n`` is more): an upper bound on any ``n`` of them."""
        if n >= self.n:
            return self.total
        left, total = max(n, 0), 0
        for size in sorted(self._counts, reverse=True):
            take = min(left, self._counts[size])
            total += take * size
            left -= take
            if not left:
                break
        return total

    def after(self, seq: int) -> int:
        """How many of the calls stored are past ``seq``."""
        return sum(1 for stored in self._stored if stored > seq)

    def ran(self, floor: int, delivered: int, pending: int, held: int) -> None:
        """After a read of the queue: every call stored at or below ``floor`` (its consumer's ack floor) ran; of
        those delivered (up to ``delivered``) above it at most ``pending`` (unacknowledged) are still there, the
        largest of them kept; and the queue holds ``held`` stored calls in all, the largest kept again. What stays
        bounds the bytes of whichever of this control plane's calls are still there (their number is counted apart:
        ``Queue.added``, from the sequences before this)."""
        gone = [seq for seq in self._stored if seq <= floor]
        out = [(size, seq) for seq, size in self._stored.items() if floor < seq <= delivered]
        gone += [seq for _, seq in heapq.nsmallest(max(0, len(out) - pending), out)]
        for seq in gone:
            self.remove(self._stored.pop(seq))
        extra = len(self._stored) - held
        if extra > 0:
            for _, seq in heapq.nsmallest(extra, ((size, seq) for seq, size in self._stored.items())):
                self.remove(self._stored.pop(seq))


@dataclass
class Queue:
    """One subject of an app's queues: the calls it ``held`` when last read, this control plane's calls stored after
    what that read counted (``added``: a sequence past the stream's last then) and being published (``publishing``)."""

    held: int = 0
    added: int = 0
    publishing: int = 0
    sizes: Sizes = field(default_factory=Sizes)
    consumer: str = ""  # the durable consumer that takes its calls: its ack floor says which have run

    @property
    def calls(self) -> int:
        return self.held + self.added + self.publishing

    def bytes(self, unknown: float) -> float:
        """The bytes it holds: the largest calls this control plane queued there, the others at ``unknown``."""
        return self.sizes.largest(self.calls) + max(0, self.calls - self.sizes.n) * unknown


@dataclass
class AppQueues:
    app: str
    queues: dict[str, Queue] = field(default_factory=dict)
    names: dict[tuple[str, int | None], tuple[str, str]] = field(default_factory=dict)  # ``QueueShares._names``
    last_seq: int = 0  # the stream's last sequence as of the last read: what that read's counts include
    read_at: float = -math.inf
    used_at: float = field(default_factory=time.monotonic)
    reading: asyncio.Task[None] | None = None

    def usage(self, size: int) -> tuple[int, float]:
        """(calls, bytes) the app's queues hold, as far as this control plane can tell, a call it did not queue
        counted as the mean of those it did (as ``size``, the call being admitted, when it queued none)."""
        known = sum(q.sizes.n for q in self.queues.values())
        unknown = sum(q.sizes.total for q in self.queues.values()) / known if known else size
        return (sum(q.calls for q in self.queues.values()),
                sum(q.bytes(unknown) for q in self.queues.values()))

    @property
    def holds(self) -> bool:
        return any(q.calls or q.sizes.n for q in self.queues.values())


@dataclass(frozen=True, eq=False)
class Ticket:
    """A call admitted: ``queued`` once its message is stored, ``release`` if it never will be. It settles in the
    ledger it was counted in, if that is still the app's (not after the app was deleted and pushed again)."""

    app: str
    state: AppQueues
    queue: Queue
    size: int


class QueueShares:
    def __init__(self, js: Any, limits: StorageLimits) -> None:
        self._js = js
        self.max_bytes = limits.calls_stream_max_bytes_per_app
        self.max_msgs = limits.calls_stream_max_msgs_per_app
        self._stream: tuple[int, int] = (-1, -1)  # the stream's own max_bytes, max_msgs, as last read
        self._apps: dict[str, AppQueues] = {}
        self._swept_at = time.monotonic()

    @property
    def off(self) -> bool:
        return self.max_bytes < 0 and self.max_msgs < 0

    def shares(self) -> tuple[int, int]:
        """(bytes, calls) an app may hold: as configured, and at most a quarter of what the stream itself holds (the
        platform gives it less where nats-server cannot reserve it all: ``reserving``); -1 for none."""
        def capped(share: int, whole: int) -> int:
            return share if share < 0 or whole <= 0 else min(share, max(1, whole // APP_SHARE))
        return capped(self.max_bytes, self._stream[0]), capped(self.max_msgs, self._stream[1])

    async def prepare(self, apps: Collection[str]) -> None:
        """Read the counts of those ``apps`` whose counts a call would wait for, all at once (a schedule's ticks
        of many apps: one round trip, not one each in turn)."""
        if not self.off:
            await asyncio.gather(*(self._fresh(self._state(app)) for app in apps))

    async def _fresh(self, state: AppQueues) -> None:
        now = time.monotonic()
        if now - state.read_at > READ_EVERY_S:
            await self._reading(state, wait=now - state.read_at > STALE_S)

    async def admit(self, app: str, function: str, version: int | None, size: int) -> Ticket | None:
        """Count a call of ``size`` bytes to ``app.function`` (pinned to ``version``) against the app's share, or
        refuse it (``OverloadedError``: 429, Retry-After) when the share would be exceeded. None when no share is
        set."""
        if self.off:
            return None
        state = self._state(app)
        subject, consumer = self._names(state, function, version)
        size += MESSAGE_OVERHEAD + len(subject)
        state.used_at = time.monotonic()
        await self._fresh(state)
        refused = self._refusal(state, size)
        if refused is not None and time.monotonic() - state.read_at > RECHECK_S:
            await self._reading(state, wait=True)  # a refusal counts on a fresh read: calls may have just run
            refused = self._refusal(state, size)
        if refused is not None:
            raise refused
        queue = state.queues.get(subject) or state.queues.setdefault(subject, Queue())
        queue.consumer = consumer
        queue.sizes.add(size)
        queue.publishing += 1
        return Ticket(app, state, queue, size)

    def _refusal(self, state: AppQueues, size: int) -> OverloadedError | None:
        """The 429 a call of ``size`` more gets, if it would pass the app's share; None if it fits."""
        max_bytes, max_msgs = self.shares()
        calls, held = state.usage(size)
        if 0 <= max_msgs < calls + 1:
            return OverloadedError(f"the app {state.app!r} holds {calls:,} queued calls, its share of the calls' queue "
                                   f"(EMBER_CALLS_STREAM_MAX_MSGS_PER_APP {max_msgs:,}); retry when some have run",
                                   retry_after_s=RETRY_AFTER_S)
        if 0 <= max_bytes < held + size:
            return OverloadedError(f"the app {state.app!r} holds {_mib(held)} of queued calls' input; with this "
                                   f"call's {_mib(size)} it would pass its share of the calls' queue "
                                   f"(EMBER_CALLS_STREAM_MAX_BYTES_PER_APP {_mib(max_bytes)}); retry when some "
                                   "have run", retry_after_s=RETRY_AFTER_S)
        return None

    def _state(self, app: str) -> AppQueues:
        state = self._apps.get(app)
        if state is None:
            state = self._apps[app] = AppQueues(app)
        return state

    @staticmethod
    def _names(state: AppQueues, function: str, version: int | None) -> tuple[str, str]:
        """The subject of ``function``'s queue (pinned to ``version``) and its consumer's name, made once."""
        names = state.names.get((function, version))
        if names is None:
            app = state.app
            names = state.names[function, version] = (
                (subjects.calls(app, function), subjects.calls_consumer(app, function)) if version is None else
                (subjects.pinned_calls(app, function, version), subjects.pinned_calls_consumer(app, function, version)))
        return names

    async def _reading(self, state: AppQueues, wait: bool) -> None:
        """Read the app's queues (one read at a time: a read under way serves), waiting for it if ``wait``."""
        if state.reading is None:
            state.reading = asyncio.ensure_future(self._read(state))
        if wait:
            await asyncio.shield(state.reading)

    def queued(self, ticket: Ticket | None, seq: int) -> None:
        """The admitted call's message is stored, at ``seq`` in the stream."""
        if ticket is not None and self._apps.get(ticket.app) is ticket.state:
            ticket.queue.publishing -= 1
            ticket.queue.added += seq > ticket.state.last_seq
            ticket.queue.sizes.stored(ticket.size, seq)

    def forget(self, app: str) -> None:
        """``app`` was deleted: its queues with it."""
        self._apps.pop(app, None)

    def release(self, ticket: Ticket | None) -> None:
        """The admitted call was not queued (its publish failed, or it was queued before)."""
        if ticket is not None and self._apps.get(ticket.app) is ticket.state:
            ticket.queue.publishing -= 1
            ticket.queue.sizes.remove(ticket.size)

    async def _read(self, state: AppQueues) -> None:
        """The calls each queue of ``app`` holds, from one stream info (this control plane's calls stored up to the
        stream's last sequence then are in it, or ran), and what each queue's consumer took."""
        queues = list(state.queues.values())
        try:
            try:
                info = await self._js.stream_info(subjects.CALLS_STREAM, subjects_filter=retire.app_queues(state.app))
            except Exception as exc:  # what was known stands until the next read (the stream's own limit holds)
                log.warning("could not read the queues of %s for its share: %s", state.app, exc)
                state.read_at = time.monotonic()
                return
            floors = await asyncio.gather(*(self._consumed(q.consumer) for q in queues))
        finally:
            state.reading = None
        state.read_at = time.monotonic()
        held = info.state.subjects or {}
        self._stream = (info.config.max_bytes or -1, info.config.max_msgs or -1)
        state.last_seq = info.state.last_seq or 0
        for subject in set(state.queues) | set(held):
            queue = state.queues.setdefault(subject, Queue())
            queue.held = held.get(subject, 0)
            queue.added = queue.sizes.after(state.last_seq)  # counted before any size goes: a count stays exact
        for queue, (floor, delivered, pending) in zip(queues, floors, strict=True):
            queue.sizes.ran(floor, delivered, pending, queue.held + queue.added)
        for subject, queue in list(state.queues.items()):
            if not queue.calls and not queue.sizes.n:
                del state.queues[subject]
        self._forget_idle(state.read_at)

    async def _consumed(self, consumer: str) -> tuple[int, int, int]:
        """Of the queue ``consumer`` takes: its ack floor (every call stored up to it ran), the last call delivered,
        and how many delivered are unacknowledged; (0, 0, 0) when not known (no consumer: a retired function's queue,
        which holds no call, so its sizes go as the read counts none)."""
        if not consumer:
            return 0, 0, 0
        try:
            info = await self._js.consumer_info(subjects.CALLS_STREAM, consumer)
        except Exception:
            return 0, 0, 0
        floor = info.ack_floor.stream_seq if info.ack_floor is not None else 0
        delivered = info.delivered.stream_seq if info.delivered is not None else 0
        return floor or 0, delivered or 0, info.num_ack_pending or 0

    def _forget_idle(self, now: float) -> None:
        if now - self._swept_at < FORGET_S / 10:
            return
        self._swept_at = now
        for app, state in list(self._apps.items()):
            if state.reading is not None or now - state.used_at <= FORGET_S:
                continue
            if state.holds:  # kept, its sizes bound its calls: read again, to be forgotten once they ran
                state.reading = asyncio.ensure_future(self._read(state))
            else:
                del self._apps[app]


def _mib(size: float) -> str:
    return f"{size / 2**20:,.1f} MiB"
