"""A replica's pull of queued calls: a lone call comes back as soon as it is there, not when a pull of many would
expire; calls that are there together come together, up to the room asked for."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from support.natsconn import connect as admin_connect

from ember_runtime.replica import queue_worker
from ember_runtime.replica.queue_worker import pull

pytestmark = pytest.mark.integration


async def _stream(nc: nats.NATS, name: str) -> object:
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
    await js.add_consumer(name, durable_name="w", ack_policy="explicit")
    return await js.pull_subscribe_bind(durable="w", stream=name)


def test_a_lone_call_is_not_held_by_a_pull_for_many(platform, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(queue_worker, "FETCH_WAIT_S", 60.0)  # held to expiry, the pull would outlast the test's wait

    async def scenario() -> list[bytes]:
        nc = await admin_connect(platform.nats_url)
        try:
            sub = await _stream(nc, "PULLLONE")
            await nc.jetstream().publish("pulllone.x", b"one")
            msgs = await asyncio.wait_for(pull(sub, 32), 10)
            return [m.data for m in msgs]
        finally:
            await nc.jetstream().delete_stream("PULLLONE")
            await nc.close()

    assert asyncio.run(scenario()) == [b"one"]


def test_calls_there_together_come_together_up_to_the_room(platform, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(queue_worker, "FETCH_WAIT_S", 30.0)  # calls there come at once; a loaded host's round
    #                                                          trip may take longer than a short wait

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        nc = await admin_connect(platform.nats_url)
        try:
            sub = await _stream(nc, "PULLMANY")
            for i in range(10):
                await nc.jetstream().publish("pullmany.x", b"%d" % i)
            first = [m.data for m in await pull(sub, 6)]
            second = [m.data for m in await pull(sub, 6)]
            monkeypatch.setattr(queue_worker, "FETCH_WAIT_S", 1.0)
            with pytest.raises(NatsTimeoutError):
                await pull(sub, 6)  # nothing left: the pull ends after FETCH_WAIT_S
            return first, second
        finally:
            await nc.jetstream().delete_stream("PULLMANY")
            await nc.close()

    first, second = asyncio.run(scenario())
    assert first == [b"%d" % i for i in range(6)]
    assert second == [b"%d" % i for i in range(6, 10)]


def test_an_empty_pull_ends_in_nats_timeout_whichever_way_the_client_timed_out(platform, monkeypatch):
    """nats-py ends an empty fetch with its own TimeoutError, or with the builtin one where its wait ran out
    between its two requests: ``pull`` raises the first for both. Before, the second reached the queue worker as
    a failure (a warning, then half a second before its next pull)."""
    monkeypatch.setattr(queue_worker, "FETCH_WAIT_S", 0.0005)  # shorter than the first request's round trip

    async def scenario() -> list[str]:
        nc = await admin_connect(platform.nats_url)
        try:
            sub = await _stream(nc, "PULLNONE")
            seen = []
            for _ in range(20):
                try:
                    seen.append(f"{len(await pull(sub, 6))} messages")
                except NatsTimeoutError:
                    seen.append("nats timeout")
                except TimeoutError:
                    seen.append("builtin timeout")
            return seen
        finally:
            await nc.jetstream().delete_stream("PULLNONE")
            await nc.close()

    assert set(asyncio.run(scenario())) == {"nats timeout"}
