"""A process told to stop while its first NATS connection is refused stops waiting for it: before, a replica
stopped while connecting went on trying (nats-py retries a refused first connection for as long as reconnects are
allowed), past its agent's grace, until the agent's SIGKILL, which a forked replica's could miss."""

from __future__ import annotations

import asyncio
import socket

from ember.wire.jetstream import connect_until


def _refused_url() -> str:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        return f"nats://127.0.0.1:{s.getsockname()[1]}"


def test_a_stop_ends_the_wait_for_a_refused_connection():
    async def scenario() -> object:
        stop = asyncio.Event()
        connecting = asyncio.ensure_future(connect_until(stop, _refused_url(), "test", wait_s=3600))
        await asyncio.sleep(0.3)
        assert not connecting.done()  # retrying, as a replica whose control plane is not up yet does
        stop.set()
        return await asyncio.wait_for(connecting, 10)

    assert asyncio.run(scenario()) is None

