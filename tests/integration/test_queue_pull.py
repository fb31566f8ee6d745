"""A replica's pulls of queued calls: a lone call comes back as soon as it is there, not when a pull of many would
expire; calls that are there together come together, up to the room asked for; a stop ends a waiting pull at
once, the server no longer serves it, and what it had delivered that no pull took is handed back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from support.natsconn import connect as admin_connect

from ember_runtime.replica import pulls
from ember_runtime.replica.pulls import Puller, PullError

pytestmark = pytest.mark.integration


def _with_stream(platform, name: str, scenario: Callable[[nats.NATS, Any], Awaitable[Any]]) -> Any:
    """Run ``scenario(nc, js)`` with stream ``name`` (subjects ``<name>.>``, lower case) and its durable "w"."""
    async def run() -> Any:
        nc = await admin_connect(platform.nats_url)
        js = nc.jetstream()
        try:
            await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
            await js.add_consumer(name, durable_name="w", ack_policy="explicit", ack_wait=30)
            return await scenario(nc, js)
        finally:
            await js.delete_stream(name)
            await nc.close()

    return asyncio.run(run())


async def _puller(nc: nats.NATS, stream: str) -> Puller:
    puller = Puller(nc, stream, "w")
    await puller.open()
    return puller


def test_a_lone_call_is_not_held_by_a_pull_for_many(platform, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pulls, "FETCH_WAIT_S", 60.0)  # held to expiry, the pull would outlast the test's wait

    async def scenario(nc: nats.NATS, js: Any) -> list[bytes]:
        puller = await _puller(nc, "PULLLONE")
        await js.publish("pulllone.x", b"before")
        first = await asyncio.wait_for(puller.pull(32), 10)
        pulling = asyncio.ensure_future(puller.pull(32))
        await asyncio.sleep(0.2)  # the pull waits on the server when the call comes
        await js.publish("pulllone.x", b"while waiting")
        second = await asyncio.wait_for(pulling, 10)
        await puller.close()
        return [m.data for m in (*first, *second)]

    assert _with_stream(platform, "PULLLONE", scenario) == [b"before", b"while waiting"]


def test_calls_there_together_come_together_up_to_the_room(platform, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pulls, "FETCH_WAIT_S", 30.0)  # calls there come at once; a loaded host's round trip may
    #                                                   take longer than a short wait

    async def scenario(nc: nats.NATS, js: Any) -> tuple[list[bytes], list[bytes]]:
        puller = await _puller(nc, "PULLMANY")
        for i in range(10):
            await js.publish("pullmany.x", b"%d" % i)
        first = [m.data for m in await puller.pull(6)]
        second = [m.data for m in await puller.pull(6)]
        monkeypatch.setattr(pulls, "FETCH_WAIT_S", 1.0)
        with pytest.raises(NatsTimeoutError):
            await puller.pull(6)  # nothing left: the pull ends when the server says it expired
        await puller.close()
        return first, second

    first, second = _with_stream(platform, "PULLMANY", scenario)
    assert first == [b"%d" % i for i in range(6)]
    assert second == [b"%d" % i for i in range(6, 10)]


def test_an_empty_pull_ends_in_nats_timeout_even_shorter_than_a_round_trip(platform, monkeypatch):
    monkeypatch.setattr(pulls, "FETCH_WAIT_S", 0.0005)

    async def scenario(nc: nats.NATS, js: Any) -> set[str]:
        puller = await _puller(nc, "PULLNONE")
        seen = set()
        for _ in range(20):
            try:
                seen.add(f"{len(await puller.pull(6))} messages")
            except NatsTimeoutError:
                seen.add("nats timeout")
        await puller.close()
        return seen

    assert _with_stream(platform, "PULLNONE", scenario) == {"nats timeout"}


def test_a_stop_ends_the_waiting_pull_and_the_server_serves_it_no_more(platform, monkeypatch):
    """Before, a stopping replica waited for its pulls to expire; a pull abandoned without telling the server would
    take the next call into an inbox no one reads, until the consumer's ack wait (30 s here) sent it again."""
    monkeypatch.setattr(pulls, "FETCH_WAIT_S", 60.0)

    async def scenario(nc: nats.NATS, js: Any) -> tuple[str, list[bytes]]:
        stopping, other = await _puller(nc, "PULLSTOP"), await _puller(nc, "PULLSTOP")
        stop = asyncio.Event()
        waiting = asyncio.ensure_future(stopping.pull(8, stop))
        await asyncio.sleep(0.2)
        stop.set()
        try:
            await asyncio.wait_for(waiting, 10)
            ended = "with calls"
        except NatsTimeoutError:
            ended = "empty"
        assert await stopping.close() == []
        await js.publish("pullstop.x", b"after the stop")
        return ended, [m.data for m in await asyncio.wait_for(other.pull(8), 10)]

    assert _with_stream(platform, "PULLSTOP", scenario) == ("empty", [b"after the stop"])


def test_calls_delivered_to_no_pull_are_handed_back_at_close(platform, monkeypatch):
    monkeypatch.setattr(pulls, "FETCH_WAIT_S", 60.0)

    async def scenario(nc: nats.NATS, js: Any) -> tuple[list[bytes], list[bytes]]:
        puller = await _puller(nc, "PULLBACK")
        await js.publish("pullback.x", b"taken")
        taken = await asyncio.wait_for(puller.pull(5), 10)  # its request lingers on the server for four more
        await js.publish("pullback.x", b"delivered, not taken")
        for _ in range(500):  # the server gave it to the lingering request
            if (await js.consumer_info("PULLBACK", "w")).num_ack_pending == 2:
                break
            await asyncio.sleep(0.02)
        return [m.data for m in taken], [m.data for m in await puller.close()]

    assert _with_stream(platform, "PULLBACK", scenario) == ([b"taken"], [b"delivered, not taken"])


def test_a_pull_the_server_ends_with_an_error_says_so(platform, monkeypatch):
    """Its consumer deleted (the app was deleted while its replica still pulled), the waiting pull ends with the
    server's word, not at its expiry nor as an empty pull that the worker would send again at once."""
    monkeypatch.setattr(pulls, "FETCH_WAIT_S", 60.0)

    async def scenario(nc: nats.NATS, js: Any) -> str:
        puller = await _puller(nc, "PULLGONE")
        waiting = asyncio.ensure_future(puller.pull(8))
        await asyncio.sleep(0.2)
        await js.delete_consumer("PULLGONE", "w")
        with pytest.raises(PullError) as ended:
            await asyncio.wait_for(waiting, 10)
        await puller.close()
        return str(ended.value)

    assert _with_stream(platform, "PULLGONE", scenario).startswith("409")


def test_lingering_requests_never_deliver_more_than_the_room_asked_for(platform, monkeypatch):
    """Calls trickling in while a batch holds the room: each pull that found none asked the server for the whole
    room again, and the requests lingering on it delivered hundreds of calls past the room, which waited unseen
    (not kept in progress) while other replicas found the queue empty, to be sent again after the ack wait."""
    monkeypatch.setattr(pulls, "FETCH_WAIT_S", 1.0)
    room = 8

    async def scenario(nc: nats.NATS, js: Any) -> tuple[int, int, int]:
        puller = await _puller(nc, "PULLROOM")
        taken: list[Any] = []

        async def trickle() -> None:
            for i in range(120):
                await js.publish("pullroom.x", b"%d" % i)
                await asyncio.sleep(0.005)

        async def worker() -> None:  # a queue worker whose batcher never frees the room it took
            while True:
                if room - len(taken) <= 0:
                    await asyncio.sleep(0.05)
                    continue
                with contextlib.suppress(NatsTimeoutError):
                    taken.extend(await puller.pull(room - len(taken)))

        working = asyncio.ensure_future(worker())
        await trickle()
        await asyncio.sleep(1.5)  # every request made has expired on the server by now
        working.cancel()
        delivered = (await js.consumer_info("PULLROOM", "w")).num_ack_pending
        waiting = len(puller.waiting())
        await puller.close()
        return len(taken), waiting, delivered

    taken, waiting, delivered = _with_stream(platform, "PULLROOM", scenario)
    assert taken == room
    assert delivered <= room and waiting == 0  # (before: all 120 delivered, 112 of them waiting unseen)
