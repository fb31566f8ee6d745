"""An agent waits for the control plane to create the buckets it writes (``open_buckets``), on a real nats-server.
A connection the server closes for good meanwhile (nats-py reconnects after a lost socket, but not after most of the
server's ``-ERR`` lines, such as an auth callout's late refusal) ends the wait with None, so that the agent connects
again (``NodeAgent.run``) instead of dying on the next request."""

from __future__ import annotations

import asyncio

import pytest
from support.nats_cluster import NatsCluster
from support.natsconn import connect

from ember import _loop as ember_loop
from ember.wire.jetstream import ensure_buckets
from ember_runtime.agent.buckets import NodeBuckets, open_buckets

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory):
    with NatsCluster(tmp_path_factory.mktemp("nats"), size=1) as cluster:
        yield cluster.url


def test_a_connection_closed_while_waiting_for_the_buckets_ends_the_wait(nats_url: str):
    async def scenario() -> object:
        nc = await connect(nats_url)
        waiting = asyncio.ensure_future(open_buckets(nc, asyncio.Event()))
        await asyncio.sleep(0.5)  # no control plane: the buckets are not there
        assert not waiting.done()
        await nc.close()  # as nats-py does itself on a server's -ERR
        return await asyncio.wait_for(waiting, 10)  # not the ConnectionClosedError of the next request

    assert ember_loop.run(scenario()) is None


def test_the_buckets_open_once_they_are_there(nats_url: str):
    async def scenario() -> object:
        nc = await connect(nats_url)
        try:
            await ensure_buckets(nc.jetstream())  # as the control plane does at its start
            return await asyncio.wait_for(open_buckets(nc, asyncio.Event()), 30)
        finally:
            await nc.close()

    assert isinstance(ember_loop.run(scenario()), NodeBuckets)
