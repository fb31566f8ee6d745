"""Streamed calls, gateway side: send a generator function's call to a replica and read its items as they come.

The protocol is in ``ember.wire.streams``. The call goes to the replica with the fewest running streams (its
sequences, by the router's load board and the streams this gateway holds open there; else the version's queue
group) and resent while no replica accepts it, at most ``MAX_ATTEMPTS`` times, each attempt with a reply subject of
its own. A late accept, from an earlier attempt or for a stream nobody waits for any more (its client left before
any replica accepted it), gets that replica told to cancel the call (``Streams.left``), unless it is the replica now
streaming it (a cancel, by call id, would end that stream too). Once accepted, the call stays with its replica: an
error after that, a replica that dies, or the deadline passing ends the stream with an error. The reader grants
credit as it takes items (about ``WINDOW_BYTES`` of them ahead, from 4 to 1024 items; ``STREAM_WINDOW`` before any
came), so the replica never runs further ahead of the HTTP client than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import weakref
from collections import deque
from collections.abc import Callable

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from ember import _tracing as tracing
from ember._errors import DeadlineExceededError, UnavailableError
from ember.wire import Invocation, encoder, error_from_info, subjects
from ember.wire.calls import Hop
from ember.wire.streams import STREAM_WINDOW, StreamChunk, StreamCredit, bundle_decoder, chunk_decoder
from ember_platform.calls import lineage
from ember_platform.calls.router import ACK_TIMEOUT_S, LIVENESS_CHECK_S, MAX_ATTEMPTS, NO_REPLICA_POLL_S, Router

log = logging.getLogger("ember.streams")
WINDOW_BYTES = 1024 * 1024  # about this much of a stream's items may be on their way (window in items: see _grant)
MIN_WINDOW, MAX_WINDOW = 4, 1024
MAX_QUEUED_CHUNKS = MAX_WINDOW + 4  # an honest replica sends no more unread messages than its credit allows
MAX_LEFT = 4096  # reply tokens given up before an accept, remembered (until their deadline) for a late accept


class _NoResponders:
    """No replica was subscribed to take the call."""


NO_RESPONDERS = _NoResponders()


class _Left:
    """A reply token given up before its accept came: whose it was, until when an accept for it may still come."""

    __slots__ = ("app", "call_id", "deadline", "stream")

    def __init__(self, stream: CallStream) -> None:
        self.app, self.call_id, self.deadline = stream.app, stream.call_id, stream.deadline
        self.stream = weakref.ref(stream)  # gone with its request: then nobody reads it


class Streams:
    """The gateway's streamed calls in flight, by their reply token; one subscription for all of them."""

    def __init__(self, nc: Client, router: Router, replica_alive: Callable[[str], bool]) -> None:
        self._nc = nc
        self.router = router
        self.alive = replica_alive
        self.inbox = ""
        self._open: dict[str, CallStream] = {}  # reply token -> stream
        self._left: dict[str, _Left] = {}  # reply token given up before an accept -> whose (oldest first)
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self.inbox = subjects.answers_inbox(secrets.token_hex(8))
        self._sub = await self._nc.subscribe(f"{self.inbox}.*.*", cb=self._on_message)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()

    def open(self, app: str, function: str, version: int, body: bytes, *, call_id: str,
             deadline: float, chain: list[Hop] | None = None) -> CallStream:
        """A stream for the call; :meth:`CallStream.start` sends it. ``chain``: the calls waiting on it (a call
        between functions)."""
        return CallStream(self, self._nc, app, function, version, body, call_id, deadline, chain)

    def listen(self, token: str, stream: CallStream) -> None:
        self._open[token] = stream

    def forget(self, token: str) -> None:
        self._open.pop(token, None)

    def left(self, token: str, stream: CallStream) -> None:
        """``token`` (of ``stream``) is given up before an accept came on it: a late accept gets its replica told to
        cancel the call (``CallStream.stray``). Remembered until the call's deadline (the replica ends it then),
        the ``MAX_LEFT`` latest at most."""
        self.forget(token)
        now = time.time()
        while self._left and (len(self._left) >= MAX_LEFT or next(iter(self._left.values())).deadline <= now):
            del self._left[next(iter(self._left))]
        self._left[token] = _Left(stream)

    async def _on_message(self, msg: Msg) -> None:
        app, _, token = msg.subject[len(self.inbox) + 1:].partition(".")
        if token == subjects.STREAM_BUNDLE:
            await self._on_bundle(app, msg)
            return
        stream = self._open.get(token)
        if stream is None or stream.app != app:
            await self._late(app, token, msg.data)  # a stream that ended, or an earlier attempt's late message
            return
        if msg.headers and msg.headers.get("Status") == "503":
            stream.deliver(token, NO_RESPONDERS)
            return
        try:
            chunk = chunk_decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            log.warning("undecodable stream message on %s: %s", msg.subject, exc)
            return
        if chunk.call_id == stream.call_id:
            stream.deliver(token, chunk)

    async def _on_bundle(self, app: str, msg: Msg) -> None:
        """Chunks of several streams of ``app`` in one message: each to its stream, as if it had come alone."""
        try:
            bundle = bundle_decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            log.warning("undecodable stream bundle on %s: %s", msg.subject, exc)
            return
        for token, raw in zip(bundle.tokens, bundle.chunks, strict=False):
            stream = self._open.get(token)
            if stream is None or stream.app != app:
                # a stream that ended, or another app's: a replica speaks for its own app's streams only
                await self._late(app, token, raw)
                continue
            try:
                chunk = chunk_decoder.decode(raw)
            except msgspec.DecodeError as exc:
                log.warning("undecodable stream message in a bundle on %s: %s", msg.subject, exc)
                continue
            if chunk.call_id == stream.call_id:
                stream.deliver(token, chunk)

    async def _late(self, app: str, token: str, data: bytes) -> None:
        """A message for a token no stream reads: an accept for one given up before it (``left``) has its replica
        told to cancel the call; anything else is dropped."""
        left = self._left.get(token)
        if left is None or left.app != app:
            return
        try:
            chunk = chunk_decoder.decode(data)
        except msgspec.DecodeError:
            return  # a 503 (no replica took that attempt), or not a chunk
        if not chunk.replica or chunk.call_id != left.call_id:
            return
        del self._left[token]
        log.info("stream %s: replica %s accepted an attempt given up", left.call_id, chunk.replica)
        stream = left.stream()
        if stream is None:  # its request is over: nobody reads the call
            await cancel(self._nc, chunk.replica, left.call_id)
        else:
            await stream.stray(chunk.replica)


class CallStream:
    """One streamed call: ``await start()``, then ``await next_items()`` until it returns None; ``aclose()``."""

    def __init__(self, streams: Streams, nc: Client, app: str, function: str, version: int, body: bytes,
                 call_id: str, deadline: float, chain: list[Hop] | None = None) -> None:
        self._streams = streams
        self._nc = nc
        self.app, self.function, self.version = app, function, version
        self.call_id = call_id
        self.deadline = deadline
        trace = tracing.current_headers({"ember.call_id": call_id}) if tracing.ON else {}  # the gateway's span
        self._invocation = Invocation(call_id=call_id, function=function, deadline=deadline,
                                      input=msgspec.Raw(body), trace=trace, chain=chain or [], bundles=True)
        self.holder = ""  # the replica that accepted it
        self.received = 0  # items handed to the reader
        self.granted = STREAM_WINDOW
        self._bytes = 0  # of the items received
        self.finished = False  # its end or error arrived (or it was given up)
        self._token = ""
        self._inbox: deque[StreamChunk | _NoResponders] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._load_key = (app, function.split(".")[0])
        self._counted = False  # in the router's in-flight count (the autoscaler's gateway load)
        self._overflow = False
        self._on = ""  # the replica counted in the router's ``streams_on`` for this stream
        self._awaiting = ""  # the replica this stream was sent to, until it accepts it (the router's ``unreported``)
        self._starting = False  # in ``start``, no accept taken yet
        self._strays: set[str] = set()  # replicas that accepted an earlier attempt meanwhile (see ``stray``)

    # -- starting: route, send, wait for an accept ------------------------------------------------------------------

    async def start(self) -> None:
        """Send the call until a replica accepts it; raises the call's error if it fails before streaming."""
        router = self._streams.router
        router.received[self._load_key] += 1
        router.in_flight[self._load_key] += 1
        self._counted = True
        tried: set[str] = set()
        attempts = 0
        self._starting = True
        try:
            while True:
                target = router.choose_stream(self.app, self.function, self.version, tried)
                if target is None and not attempts:
                    router.on_unserved(*self._load_key)
                self._count_on(target or "")
                self._await_accept(target or "")
                await self._send(target)
                attempts += 1
                outcome = await self._accepted(target)
                if outcome is None:
                    return
                if target:
                    tried.add(target)
                if isinstance(outcome, _NoResponders):  # nobody took that attempt: no accept can come for it
                    self._streams.forget(self._token)
                    self._token = ""
                    attempts -= 1
                    await asyncio.sleep(min(NO_REPLICA_POLL_S, max(self.deadline - time.time(), 0)))
                    if time.time() >= self.deadline:
                        raise UnavailableError(f"no replica of {self.app}.{self.function} became ready before the "
                                               "deadline", retry_after_s=1.0, call_id=self.call_id)
                    continue
                if attempts >= MAX_ATTEMPTS:
                    raise UnavailableError(f"{self.app}.{self.function}: {outcome} (after {attempts} attempts)",
                                           retry_after_s=1.0, call_id=self.call_id)
                log.warning("stream %s: %s; sending it again", self.call_id, outcome)
                if target:
                    await self._cancel(target)
        except BaseException:
            self._starting, self.finished = False, True  # nobody will read it: an accept yet to come is a stray
            self._done()
            for replica in self._strays | self._accepts_unread() | ({self.holder} if self.holder else set()):
                await self._cancel(replica)
            raise

    async def _send(self, target: str | None) -> None:
        if self._token:
            self._strays |= self._accepts_unread()
            self._streams.left(self._token, self)
        self._token = secrets.token_hex(8)
        self._inbox.clear()
        self._streams.listen(self._token, self)
        subject = subjects.replica_invoke(target) if target else subjects.invoke(self.app, self.function,
                                                                                 self.version)
        try:
            await self._nc.publish(subject, encoder.encode([self._invocation]),
                                   reply=f"{self._streams.inbox}.{self.app}.{self._token}")
        except Exception as exc:
            raise UnavailableError(f"could not send the call to {self.app}.{self.function}: {exc}",
                                   retry_after_s=1.0, call_id=self.call_id) from exc

    async def _accepted(self, target: str | None) -> str | _NoResponders | None:
        """None once accepted; else why to try again. Raises the call's own error (it never streamed)."""
        left = self.deadline - time.time()
        try:
            first = await self._next(min(left, ACK_TIMEOUT_S))
        except TimeoutError:
            if left <= ACK_TIMEOUT_S:
                raise DeadlineExceededError(f"{self.app}.{self.function} did not start streaming within its "
                                            "deadline", call_id=self.call_id) from None
            return "no replica accepted the call"
        if isinstance(first, _NoResponders):
            return first
        if first.error is not None:
            if first.error.code == UnavailableError.code:  # it never ran the call
                return f"replica {target or '?'} is shutting down"
            self.finished = True
            raise error_from_info(msgspec.structs.replace(first.error, call_id=self.call_id))
        if first.replica:
            self.holder = first.replica
            self._starting = False
            self._count_on(first.replica)
            self._await_accept("")
            self._streams.router.unreported.accepted(self.app, first.replica, first.accepted)
            self._strays.discard(first.replica)
            for replica in sorted(self._strays):  # each kept until told: a cancel meanwhile tells the rest (below)
                await self._cancel(replica)
                self._strays.discard(replica)
            return None
        self._starting = False
        self._inbox.appendleft(first)  # items before the accept (not sent by this protocol): read them in turn
        return None

    # -- reading ---------------------------------------------------------------------------------------------------

    async def next_items(self) -> list[msgspec.Raw] | None:
        """The next items (at least one), or None at the stream's end; raises the error it ended with."""
        while True:
            if self.finished:
                return None
            chunk = await self._next_live()
            if chunk.seq != self.received and (chunk.items or chunk.end):
                self._fail()
                raise UnavailableError(f"the stream of {self.app}.{self.function} lost items (expected item "
                                       f"{self.received}, got {chunk.seq})", call_id=self.call_id)
            if chunk.error is not None:
                self.finished = True
                self._done()
                raise error_from_info(msgspec.structs.replace(chunk.error, call_id=self.call_id))
            if chunk.end:
                self.finished = True
                self._done()
                return None
            if chunk.items:
                self.received += len(chunk.items)
                self._bytes += sum(len(item) for item in chunk.items)
                await self._grant()
                return chunk.items

    async def _next_live(self) -> StreamChunk:
        """The next message, watching the holder's liveness and the deadline meanwhile."""
        while True:
            left = self.deadline - time.time()
            if left <= 0:
                self._fail()
                raise DeadlineExceededError(f"the stream of {self.app}.{self.function} ran past its deadline",
                                            call_id=self.call_id)
            try:
                item = await self._next(min(left, LIVENESS_CHECK_S))
            except TimeoutError:
                if self.holder and not self._streams.alive(self.holder):
                    self._fail()
                    raise UnavailableError(f"replica {self.holder} died while streaming", retry_after_s=0.1,
                                           call_id=self.call_id) from None
                continue
            if isinstance(item, StreamChunk):
                return item

    async def _grant(self) -> None:
        """More credit once half of it is used: a window of about ``WINDOW_BYTES`` of the items seen so far (many
        small items in flight keep a fast stream going; few large ones bound what waits in buffers)."""
        size = self._bytes / self.received if self.received else 1.0
        window = int(min(MAX_WINDOW, max(MIN_WINDOW, WINDOW_BYTES // max(size, 1.0))))
        if self.granted - self.received > window // 2 or not self.holder:
            return
        self.granted = self.received + window
        with contextlib.suppress(Exception):  # a lost grant: the replica waits until its deadline at worst
            await self._nc.publish(subjects.replica_credit(self.holder),
                                   encoder.encode(StreamCredit(call_id=self.call_id, upto=self.granted)))

    # -- ending ----------------------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop reading: a stream that has not ended is cancelled on its replica (the generator is closed), and the
        calls it made through the relay end with it (``lineage.announce``). Its counts are settled first: a reader
        cancelled again while the cancel is sent (starlette's cancel scope cancels at every await) leaves none
        behind."""
        ending = not self.finished
        self.finished = True
        self._done()
        if ending and self.holder:
            await self._cancel(self.holder)
            await lineage.announce(self._nc, self.app, self.call_id)

    def _fail(self) -> None:
        """Give up on the stream: the reader sees its error; the replica is told by ``aclose``."""
        self._streams.forget(self._token)

    def _count_on(self, replica: str) -> None:
        """Count this stream on ``replica`` (nothing: on none) in the router's open streams per replica."""
        on = self._streams.router.streams_on
        if self._on:
            on[self._on] -= 1
            if on[self._on] <= 0:
                del on[self._on]
        self._on = replica
        if replica:
            on[replica] += 1

    def _await_accept(self, replica: str) -> None:
        """Count this stream as sent to ``replica`` and not accepted yet (nothing: no longer awaited)."""
        unreported = self._streams.router.unreported
        if self._awaiting:
            unreported.unsent(self.app, self._awaiting)
        self._awaiting = replica
        if replica:
            unreported.sent(self.app, replica)

    def _done(self) -> None:
        if self._token and not self.holder:  # given up before an accept: one may still come (``Streams.left``)
            self._streams.left(self._token, self)
        else:
            self._streams.forget(self._token)
        self._count_on("")
        self._await_accept("")
        if self._counted:
            self._counted = False
            in_flight = self._streams.router.in_flight
            in_flight[self._load_key] -= 1
            if in_flight[self._load_key] <= 0:
                del in_flight[self._load_key]

    async def stray(self, replica: str) -> None:
        """``replica`` accepted an attempt of this call that is given up (``Streams.left``): it is told to cancel
        the call, unless it is the replica this stream reads from (its cancel, by call id, would end this stream as
        well: that replica took the call twice); while no accept is taken yet, that waits until one is."""
        if self._starting:
            self._strays.add(replica)
        elif self.finished or replica != self.holder:
            await self._cancel(replica)

    def _accepts_unread(self) -> set[str]:
        """The replicas whose accepts wait in the inbox, unread."""
        return {item.replica for item in self._inbox if isinstance(item, StreamChunk) and item.replica}

    async def _cancel(self, replica_id: str) -> None:
        await cancel(self._nc, replica_id, self.call_id)

    # -- the inbox ---------------------------------------------------------------------------------------------------

    def deliver(self, token: str, item: StreamChunk | _NoResponders) -> None:
        if token != self._token:
            return
        if len(self._inbox) >= MAX_QUEUED_CHUNKS:  # more than any credit allows: not a replica playing by the rules
            self._overflow = True
            return
        self._inbox.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _next(self, timeout: float) -> StreamChunk | _NoResponders:
        if self._overflow:
            raise UnavailableError(f"the replica of {self.app}.{self.function} sent more than its credit",
                                   call_id=self.call_id)
        if not self._inbox:
            loop = asyncio.get_running_loop()
            self._waiter = loop.create_future()
            # Not wait_for: on Python 3.11 it returns an item that came as its task was cancelled, the cancel lost
            # (a gateway whose client left read the model's pieces on, to their end or the deadline).
            try:
                async with asyncio.timeout(max(timeout, 0.0)):
                    await self._waiter
            finally:
                self._waiter = None
        return self._inbox.popleft()


async def cancel(nc: Client, replica_id: str, call_id: str) -> None:
    """Tell ``replica_id`` to cancel the call (a stream: its generator is closed, or its sequence leaves)."""
    try:
        await nc.publish(subjects.replica_cancel(replica_id), call_id.encode())
    except Exception as exc:  # the replica stops at the deadline, or when its credit runs out, either way
        log.warning("could not cancel stream %s on %s: %s", call_id, replica_id, exc)
