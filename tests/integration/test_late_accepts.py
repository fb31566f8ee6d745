"""Late accepts of streamed calls: a replica that accepts an attempt the gateway has given up (its client left before
any accept came, or the call was sent again elsewhere meanwhile) is told to cancel it, unless it is the replica that
streams the call now (a cancel, by call id, would end that stream as well).

The gateway's ``Streams`` runs here, against a stand-in replica written here (plain subscribers on the real
nats-server of the session's platform), so that each test chooses when, and from which replica, an accept comes.
Without load reports the gateway sends each attempt to the version's queue group; one the stand-in leaves
unanswered is sent again after ``ACK_TIMEOUT_S``."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import msgspec
import nats
import pytest
from nats.aio.subscription import Subscription
from support.natsconn import connect as admin_connect

from ember.wire import encoder, invocations_decoder, natsflush, subjects
from ember.wire.streams import StreamChunk
from ember_platform.calls.router import Router
from ember_platform.calls.streams import CallStream, Streams

pytestmark = pytest.mark.integration
WAIT_S = 30.0  # for what must come (an attempt sent again comes after ACK_TIMEOUT_S)


@dataclass
class Stage:
    """A gateway's ``Streams`` and, on a connection of its own, a stand-in for two replicas, ``a`` and ``b``: the
    attempts sent to the queue group, and the cancels each replica is told."""

    streams: Streams
    gateway: nats.NATS
    replica: nats.NATS
    app: str
    a: str
    b: str
    attempts: Subscription
    cancels: dict[str, Subscription]

    def open(self, call_id: str) -> CallStream:
        return self.streams.open(self.app, "f", 1, b"{}", call_id=call_id, deadline=time.time() + 60)

    async def attempt(self, call_id: str) -> str:
        """The next attempt of ``call_id``: its reply subject."""
        msg = await self.attempts.next_msg(timeout=WAIT_S)
        assert [i.call_id for i in invocations_decoder.decode(msg.data)] == [call_id]
        return msg.reply

    async def accept(self, reply: str, call_id: str, replica: str) -> None:
        await self.replica.publish(reply, encoder.encode(StreamChunk(call_id=call_id, replica=replica, accepted=1)))

    async def told(self, replica: str) -> list[str]:
        """The cancels ``replica`` got so far, all the gateway sent until now (both connections flushed)."""
        await natsflush.flush(self.gateway)
        await natsflush.flush(self.replica)
        sub, calls = self.cancels[replica], []
        while sub.pending_msgs:
            calls.append((await sub.next_msg(timeout=WAIT_S)).data.decode())
        return calls

    async def next_cancel(self, replica: str) -> str:
        return (await self.cancels[replica].next_msg(timeout=WAIT_S)).data.decode()


@asynccontextmanager
async def _stage(nats_url: str) -> AsyncIterator[Stage]:
    gateway, replica = await admin_connect(nats_url), await admin_connect(nats_url)
    streams = Streams(gateway, Router(gateway, replica_alive=lambda _: True), lambda _: True)
    await streams.start()
    app, a, b = (f"{name}{uuid.uuid4().hex[:8]}" for name in ("late", "ra", "rb"))
    cancels = {r: await replica.subscribe(subjects.replica_cancel(r)) for r in (a, b)}
    attempts = await replica.subscribe(subjects.invoke(app, "f", 1))
    await natsflush.flush(replica)
    try:
        yield Stage(streams, gateway, replica, app, a, b, attempts, cancels)
    finally:
        await streams.stop()
        await gateway.close()
        await replica.close()


async def _left_early(stage: Stage, call_id: str) -> tuple[CallStream, str]:
    """A stream whose request's task is cancelled (its client left) while the call waits for an accept: the stream
    and its attempt's reply subject."""
    stream = stage.open(call_id)
    starting = asyncio.create_task(stream.start())
    reply = await stage.attempt(call_id)
    starting.cancel()
    await asyncio.wait([starting])
    assert starting.cancelled()
    await stream.aclose()
    return stream, reply


def test_a_stream_left_before_its_accept_is_cancelled_on_the_replica_that_accepts_it_late(platform):
    async def scenario() -> None:
        async with _stage(platform.nats_url) as stage:
            stream, reply = await _left_early(stage, "left-early")
            await stage.accept(reply, "left-early", stage.a)
            assert await stage.next_cancel(stage.a) == "left-early"
            assert stream.finished

    asyncio.run(scenario())


def test_a_late_accept_once_nothing_holds_the_stream_cancels_it_all_the_same(platform):
    """The request is over: nothing refers to its stream any more."""
    async def scenario() -> None:
        async with _stage(platform.nats_url) as stage:
            reply = (await _left_early(stage, "gone"))[1]
            gc.collect()
            assert [left.stream() for left in stage.streams._left.values()] == [None]
            await stage.accept(reply, "gone", stage.a)
            assert await stage.next_cancel(stage.a) == "gone"

    asyncio.run(scenario())


def test_an_earlier_attempts_late_accept_cancels_it_on_that_replica_not_on_the_one_streaming(platform):
    async def scenario() -> None:
        async with _stage(platform.nats_url) as stage:
            stream = stage.open("resent")
            starting = asyncio.create_task(stream.start())
            first = await stage.attempt("resent")  # left unanswered: sent again
            second = await stage.attempt("resent")
            assert first != second
            await stage.accept(second, "resent", stage.b)
            await asyncio.wait_for(starting, WAIT_S)
            assert stream.holder == stage.b
            await stage.accept(first, "resent", stage.a)  # late
            assert await stage.next_cancel(stage.a) == "resent"
            assert await stage.told(stage.b) == []  # the stream goes on
            await stream.aclose()
            assert await stage.next_cancel(stage.b) == "resent"

    asyncio.run(scenario())


def test_a_late_accept_while_the_next_attempt_waits_cancels_once_another_replica_accepts(platform):
    async def scenario() -> None:
        async with _stage(platform.nats_url) as stage:
            stream = stage.open("crossed")
            starting = asyncio.create_task(stream.start())
            first = await stage.attempt("crossed")
            second = await stage.attempt("crossed")
            await stage.accept(first, "crossed", stage.a)  # late, the second attempt not accepted yet
            await stage.accept(second, "crossed", stage.b)
            await asyncio.wait_for(starting, WAIT_S)
            assert stream.holder == stage.b
            assert await stage.next_cancel(stage.a) == "crossed"
            assert await stage.told(stage.b) == []
            await stream.aclose()

    asyncio.run(scenario())


def test_a_late_accept_from_the_replica_streaming_the_call_cancels_nothing(platform):
    """The queue group gave both attempts to one replica: a cancel by call id would end the stream read now."""
    async def scenario() -> None:
        async with _stage(platform.nats_url) as stage:
            stream = stage.open("twice")
            starting = asyncio.create_task(stream.start())
            first = await stage.attempt("twice")
            second = await stage.attempt("twice")
            await stage.accept(second, "twice", stage.a)
            await asyncio.wait_for(starting, WAIT_S)
            await stage.accept(first, "twice", stage.a)  # late, from the same replica
            item = StreamChunk(call_id="twice", seq=0, items=[msgspec.Raw(b"1")])
            await stage.replica.publish(second, encoder.encode(item))
            items = await asyncio.wait_for(stream.next_items(), WAIT_S)
            assert [bytes(i) for i in items or []] == [b"1"]  # the late accept was read before it
            assert await stage.told(stage.a) == []
            await stream.aclose()
            assert await stage.next_cancel(stage.a) == "twice"

    asyncio.run(scenario())


def test_a_reader_cancelled_as_an_item_arrives_is_cancelled_all_the_same(platform):
    """The request's task is cancelled (its client left) in the same turn of the loop as the replica's next item
    comes: the cancel is not lost to the item. ``asyncio.wait_for`` on Python 3.11 returned the item and dropped the
    cancel, and an answer not streamed then read its model's pieces on, to their end or the call's deadline."""
    async def scenario() -> None:
        async with _stage(platform.nats_url) as stage:
            stream = stage.open("crossing")
            starting = asyncio.create_task(stream.start())
            reply = await stage.attempt("crossing")
            await stage.accept(reply, "crossing", stage.a)
            await asyncio.wait_for(starting, WAIT_S)
            reader = asyncio.create_task(stream.next_items())
            delivered = stream.deliver

            def deliver_and_leave(token: str, item: StreamChunk) -> None:
                delivered(token, item)
                reader.cancel()  # the client's disconnect, seen in the same turn

            stream.deliver = deliver_and_leave  # type: ignore[method-assign]
            item = StreamChunk(call_id="crossing", seq=0, items=[msgspec.Raw(b"1")])
            await stage.replica.publish(reply, encoder.encode(item))
            await asyncio.wait([reader], timeout=WAIT_S)
            assert reader.cancelled()
            await stream.aclose()

    asyncio.run(scenario())


def test_a_stream_left_while_its_strays_are_told_is_cancelled_on_its_holder_too(platform):
    """The request's task is cancelled (its client left) just as the stream, accepted by one replica, tells another
    that accepted an earlier attempt to cancel it: the replica that accepted is told as well (it streamed on to the
    call's deadline, nobody reading)."""
    async def scenario() -> None:
        async with _stage(platform.nats_url) as stage:
            stream = stage.open("leaving")
            starting = asyncio.create_task(stream.start())
            first = await stage.attempt("leaving")
            second = await stage.attempt("leaving")
            await stage.accept(first, "leaving", stage.a)  # late, the second attempt not accepted yet
            told = stream._cancel

            left: list[str] = []

            async def tell_and_leave(replica: str) -> None:
                if replica == stage.a and not left:
                    left.append(replica)
                    starting.cancel()  # the client's disconnect, while the stray is being told
                    await asyncio.sleep(0)
                await told(replica)

            stream._cancel = tell_and_leave  # type: ignore[method-assign]
            await stage.accept(second, "leaving", stage.b)
            await asyncio.wait([starting], timeout=WAIT_S)
            assert starting.cancelled()
            assert await stage.next_cancel(stage.a) == "leaving"
            assert await stage.next_cancel(stage.b) == "leaving"

    asyncio.run(scenario())
