"""Streamed calls in a replica: a generator's items go to the gateway as they come, within the credit it grants.

One :class:`StreamSink` per streamed call (see ``ember.wire.streams`` for the protocol). The generator runs where
its function runs (a sync one on an executor thread, an async one as a task on the event loop) and hands each
item to its sink, which frames the items of one turn of the loop into one message. Past the credit the producer
waits (a sync generator's thread blocks, an async one awaits), so a slow reader never makes the replica buffer
more than ``STREAM_WINDOW`` items per call. A cancelled call (its caller went away) or one past its deadline
stops at the next item: the generator is closed, so that its ``finally`` runs; an async generator is cancelled
at once, wherever it awaits.

A replica may hold several attempts of one call (the gateway sent it again, and the queue group gave the attempts to
the same replica): each has its sink, found by call id and reply subject. The gateway reads only the latest (it sends
no attempt after the one it took, and its attempts reach a replica in the order it sent them): an attempt superseded
is ended as soon as the next one comes, as if cancelled, and no credit goes to it; a cancel, which names the call,
ends every one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec

from ember._errors import EmberError, RemoteError
from ember._inner import current_call
from ember.wire import encode_output, encoder, error_info, subjects
from ember.wire.frames import FRAME_ITEM_OVERHEAD_BYTES
from ember.wire.streams import STREAM_WINDOW, StreamBundle, StreamChunk
from ember_runtime.batching.isolation import RunExpired

log = logging.getLogger("ember.replica")


class StreamClosed(EmberError):
    """The stream's caller went away: nothing more is sent (never on the wire)."""

    code = "cancelled"


class StreamSink:
    """Where one streamed call's items go: the gateway's reply subject, within its credit."""

    def __init__(self, streams: Streams, reply: str, call_id: str, deadline: float, bundles: bool = False) -> None:
        self._streams = streams
        self._loop = asyncio.get_running_loop()
        self.reply = reply
        self.bundles = bundles  # its caller reads bundles: its messages may go with other streams' (StreamBundle)
        self.call_id = call_id
        self.deadline = deadline
        self.granted = STREAM_WINDOW  # items numbered below this may be sent
        self.produced = 0  # items handed over by the generator (numbered 0 .. produced - 1)
        self.cancelled = False
        self.superseded = False  # a later attempt of its call came: no credit reaches this one any more
        self.task: asyncio.Task[Any] | None = None  # an async generator's own task, cancelled with the call
        self._credit = asyncio.Event()
        self._pending: list[msgspec.Raw] = []  # items of this turn of the loop, not yet framed
        self._first = 0  # the number of ``_pending[0]``
        self._flush: asyncio.Handle | None = None
        self._lock = threading.Lock()
        self._handoff: list[msgspec.Raw] = []  # items from an executor thread, not yet on the loop

    # -- producer side: any thread (sync generators) or the loop (async ones) ------------------------------------

    def put_threadsafe(self, item: Any) -> None:
        """Hand one item over from an executor thread; blocks while the reader has no credit left."""
        raw = self._encode(item)
        if self.produced >= self.granted or self.cancelled:
            asyncio.run_coroutine_threadsafe(self._wait_credit(), self._loop).result()
        self._check_deadline()
        self.produced += 1
        with self._lock:  # handed over in bunches: one wake-up of the loop per bunch, not per item
            self._handoff.append(raw)
            wake = len(self._handoff) == 1
        if wake:
            self._loop.call_soon_threadsafe(self._take_handoff)

    def _take_handoff(self) -> None:
        with self._lock:
            handed, self._handoff = self._handoff, []
        for raw in handed:
            self._queue(raw)

    def put_now(self, item: Any) -> None:
        """Hand one item over on the loop, within the credit the caller checked (a Continuous step's piece)."""
        raw = self._encode(item)
        self._check_deadline()
        self.produced += 1
        self._queue(raw)

    @property
    def credit_event(self) -> asyncio.Event:
        """Set when the reader grants more credit, or the call is cancelled."""
        return self._credit

    async def put(self, item: Any) -> None:
        """Hand one item over on the loop; waits while the reader has no credit left."""
        raw = self._encode(item)
        if self.produced >= self.granted or self.cancelled:
            await self._wait_credit()
        self._check_deadline()
        self.produced += 1
        self._queue(raw)

    def _encode(self, item: Any) -> msgspec.Raw:
        if self.cancelled:
            raise StreamClosed("the caller went away")
        raw = encode_output(item)
        if len(raw) + FRAME_ITEM_OVERHEAD_BYTES > self._streams.max_payload:
            raise RemoteError(f"item {self.produced} of the stream ({len(raw)} bytes) is over the "
                              f"{self._streams.max_payload}-byte limit of a NATS message", remote_type="ValueError")
        return msgspec.Raw(raw)

    def _check_deadline(self) -> None:
        if time.time() >= self.deadline:
            raise RunExpired("the stream ran past the call's deadline", call_id=self.call_id)

    async def _wait_credit(self) -> None:
        while not self.cancelled and self.produced >= self.granted:
            self._credit.clear()
            left = self.deadline - time.time()
            if left <= 0:
                raise RunExpired("the stream's reader took no more items before the call's deadline",
                                 call_id=self.call_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._credit.wait(), left)
        if self.cancelled:
            raise StreamClosed("the caller went away")

    # -- the loop's side ------------------------------------------------------------------------------------------

    def grant(self, upto: int) -> None:
        if upto > self.granted:
            self.granted = upto
            self._credit.set()

    def cancel(self) -> None:
        self.cancelled = True
        self._credit.set()
        if self.task is not None:
            self.task.cancel()

    def accept(self, replica_id: str, accepted: int) -> None:
        self._send(StreamChunk(call_id=self.call_id, replica=replica_id, accepted=accepted))

    def _send(self, chunk: StreamChunk) -> None:
        self._streams.send(self.reply, chunk, self.bundles)

    def _queue(self, raw: msgspec.Raw) -> None:
        if self._flush is None:
            self._flush = self._loop.call_soon(self._frame)
        self._pending.append(raw)

    def _frame(self) -> None:
        self._flush = None
        pending, self._pending = self._pending, []
        if pending and not self.cancelled:
            limit = self._streams.max_payload
            first, used, items = self._first, 0, list[msgspec.Raw]()
            for raw in pending:  # cut into messages within the NATS limit
                if items and used + len(raw) + FRAME_ITEM_OVERHEAD_BYTES > limit:
                    self._send(StreamChunk(call_id=self.call_id, seq=first, items=items))
                    first, used, items = first + len(items), 0, []
                items.append(raw)
                used += len(raw) + FRAME_ITEM_OVERHEAD_BYTES
            self._send(StreamChunk(call_id=self.call_id, seq=first, items=items))
        self._first += len(pending)

    async def finish(self, _output: Any, error: EmberError | None, _batch_size: int) -> None:
        """The generator is done (the batcher's answer): send what is pending, then its end or its error."""
        self._streams.close(self)
        if self.cancelled:
            return
        self._take_handoff()
        if self._flush is not None:
            self._flush.cancel()
            self._frame()
        end = StreamChunk(call_id=self.call_id, seq=self.produced, end=error is None,
                          error=error_info(error, self.call_id) if error is not None else None)
        self._send(end)


class Streams:
    """A replica's streamed calls in progress, by call id (each attempt of one: see the module's docstring); their
    messages go out in order, one sender task, those
    of one turn of the loop for the same gateway in one bundle where the gateway reads bundles (a Continuous step's
    pieces for all of that gateway's streams: one message per step, not one per sequence)."""

    def __init__(self, nc: Any, replica_id: str) -> None:
        self._nc = nc
        self.replica_id = replica_id
        self.max_payload: int = nc.max_payload
        self._open: dict[str, list[StreamSink]] = {}  # call id -> its attempts here, in the order they came
        self.accepted = 0  # streams accepted so far: each accept and each load report says it
        self._outbox: list[tuple[str, bytes, bool]] = []  # (reply subject, chunk, may go in a bundle)
        self._sender: asyncio.Task[None] | None = None

    def open(self, reply: str, call_id: str, deadline: float, bundles: bool = False) -> StreamSink:
        sink = StreamSink(self, reply, call_id, deadline, bundles)
        attempts = self._open.setdefault(call_id, [])
        for earlier in attempts:  # read by nobody now: ended at once (it held its slot until the call's deadline)
            earlier.superseded = True
            earlier.cancel()
        attempts.append(sink)
        self.accepted += 1
        sink.accept(self.replica_id, self.accepted)
        return sink

    def close(self, sink: StreamSink) -> None:
        """``sink``'s stream ended: it is no longer open."""
        attempts = self._open.get(sink.call_id, [])
        if sink in attempts:
            attempts.remove(sink)
            if not attempts:
                del self._open[sink.call_id]

    def grant(self, call_id: str, upto: int) -> None:
        """Credit for the call's latest attempt here (an earlier one, superseded, is read by nobody)."""
        for sink in self._open.get(call_id, ()):
            if not sink.superseded:
                sink.grant(upto)

    def cancel(self, call_id: str) -> bool:
        """End every attempt of the call held here; whether there was any."""
        attempts = self._open.pop(call_id, [])
        for sink in attempts:
            sink.cancel()
        return bool(attempts)

    def cancel_all(self) -> None:
        for call_id in list(self._open):
            self.cancel(call_id)

    def send(self, reply: str, chunk: StreamChunk, bundles: bool = False) -> None:
        self._outbox.append((reply, encoder.encode(chunk), bundles))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send_all(), name="stream-sender")

    async def _send_all(self) -> None:
        while self._outbox:
            batch, self._outbox = self._outbox, []
            for subject, data in bundled(batch, self.max_payload):
                try:
                    await self._nc.publish(subject, data)
                except Exception as exc:  # the gateway's liveness check ends a stream that gets nothing
                    log.warning("could not send a stream message to %s: %s", subject, exc)

    async def drain(self) -> None:
        """Wait until what is queued has been handed to the connection."""
        while self._sender is not None and not self._sender.done():
            await asyncio.shield(self._sender)


_BUNDLE_ITEM_BYTES = 24  # a bundled chunk's share of its bundle beyond its own bytes (its token, separators)


def bundled(batch: list[tuple[str, bytes, bool]], limit: int) -> list[tuple[str, bytes]]:
    """The messages to publish for ``batch`` (reply subject, chunk, may go in a bundle), in its order: the chunks
    for one gateway's streams of one app together, as ``StreamBundle``s within ``limit`` bytes, where there are
    several; each other chunk alone, to its own reply subject."""
    order: list[str | tuple[str, bytes]] = []  # a message to send alone, or the subject of a bundle's group
    groups: dict[str, list[tuple[str, str, bytes]]] = {}  # bundle subject -> (reply, token, chunk) in order
    for reply, data, bundles in batch:
        target = subjects.stream_bundle(reply) if bundles else None
        if target is None:
            order.append((reply, data))
            continue
        if target[0] not in groups:
            groups[target[0]] = []
            order.append(target[0])
        groups[target[0]].append((reply, target[1], data))
    messages: list[tuple[str, bytes]] = []
    for entry in order:
        if not isinstance(entry, str):
            messages.append(entry)
            continue
        group = groups[entry]
        if len(group) == 1:
            messages.append((group[0][0], group[0][2]))
        else:
            messages.extend(_bundles(entry, group, limit))
    return messages


def _bundles(subject: str, group: list[tuple[str, str, bytes]], limit: int) -> list[tuple[str, bytes]]:
    bundles: list[tuple[str, bytes]] = []
    tokens: list[str] = []
    chunks: list[msgspec.Raw] = []
    used = 64
    for _reply, token, data in group:
        size = len(data) + len(token) + _BUNDLE_ITEM_BYTES
        if chunks and used + size > limit:
            bundles.append((subject, encoder.encode(StreamBundle(tokens=tokens, chunks=chunks))))
            tokens, chunks, used = [], [], 64
        tokens.append(token)
        chunks.append(msgspec.Raw(data))
        used += size
    bundles.append((subject, encoder.encode(StreamBundle(tokens=tokens, chunks=chunks))))
    return bundles


def drain_sync(gen: Iterator[Any], sink: StreamSink) -> None:
    """Run a sync generator on this (executor) thread, each item to ``sink``; closes it however it ends."""
    try:
        for item in gen:
            sink.put_threadsafe(item)
    finally:
        close = getattr(gen, "close", None)
        if close is not None:
            close()


async def drain_async(agen: AsyncIterator[Any], sink: StreamSink) -> None:
    """Run an async generator in a task of its own (cancelled with the call), each item to ``sink``."""
    async def pump() -> None:
        try:
            async for item in agen:
                await sink.put(item)
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                await aclose()

    sink.task = asyncio.create_task(pump(), name=f"stream-{sink.call_id}")
    try:
        await sink.task
    except asyncio.CancelledError:
        if sink.cancelled and not _cancelling():
            raise StreamClosed("the caller went away") from None
        raise


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def collect_sync(gen: Iterator[Any]) -> list[Any]:
    """A queued call of a streaming function: its items, as one list; a cancelled call's generator is closed at its
    next item."""
    call = current_call()
    items: list[Any] = []
    try:
        for item in gen:
            if call is not None and call.cancelled.is_set():
                break
            items.append(item)
    finally:
        close = getattr(gen, "close", None)
        if close is not None:
            close()
    return items


async def collect_async(agen: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in agen]

