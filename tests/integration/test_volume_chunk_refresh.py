"""A volume chunk uploaded again near the collector's grace is written anew, so the commit that follows finds it.

The collector deletes the chunks no version uses once uploaded ``grace_s`` ago (an abandoned put's). An upload of a
chunk already stored changed nothing before: another tenant's copy of the same bytes, or a put resumed after a long
pause, was taken by the next collection (or at once, by the owner's removal of its volume), and the commit after it
was a 409. Against a bare nats-server of its own, with a grace of three seconds."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest
from support.nats_cluster import NatsCluster
from support.natsconn import connect

from ember.wire.jetstream import ensure_buckets
from ember.wire.volumes import VolumeFile
from ember_platform.auth.scopes import Principal
from ember_platform.control.owners import Owners
from ember_platform.volumes.store import VolumeStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
GRACE_S = 3.0  # a copy uploaded anew counts as fresh for half of it: room for a slow machine between steps


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory):
    with NatsCluster(tmp_path_factory.mktemp("nats"), size=1) as cluster:
        yield cluster.url


async def _store(url: str) -> tuple[VolumeStore, object]:
    nc = await connect(url)
    stores = await ensure_buckets(nc.jetstream())
    store = VolumeStore(stores.volumes, stores.volume_chunks, nc.jetstream(), max_value_bytes=1 << 20,
                        max_payload=nc.max_payload, grace_s=GRACE_S)
    store.owners = await Owners.open(nc.jetstream())
    await store.mirror.start()
    return store, nc


def _chunk() -> tuple[str, bytes, list[VolumeFile]]:
    data = os.urandom(4096)
    sha = hashlib.sha256(data).hexdigest()
    return sha, data, [VolumeFile(path="w.bin", size=len(data), chunks=[sha])]


def test_another_tenants_copy_outlives_the_removal_of_the_volume_it_came_from(nats_url):
    async def scenario() -> None:
        store, nc = await _store(nats_url)
        try:
            sha, data, files = _chunk()
            await store.put_chunk(sha, data, ["team-a-*"])
            await store.commit("team-a-w", files, 8 << 20)
            await asyncio.sleep(GRACE_S * 1.2)  # older than the grace
            await store.put_chunk(sha, data, ["team-b-*"])  # the same bytes, for team b's volume
            assert await store.remove("team-a-w", []) == []
            assert (await store.commit("team-b-w", files, 8 << 20)).version == 1  # a 409 before
        finally:
            await store.mirror.stop()
            await nc.close()  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_a_put_resumed_after_a_pause_is_asked_again_and_outlives_the_next_collection(nats_url):
    async def scenario() -> None:
        store, nc = await _store(nats_url)
        try:
            sha, data, files = _chunk()
            await store.put_chunk(sha, data, ["team-a-*"])  # an abandoned put
            await asyncio.sleep(GRACE_S * 1.2)
            principal = Principal("t", frozenset({"deploy"}), ["team-a-*"])
            assert await store.missing([sha], principal) == [sha]  # near its collection: uploaded anew
            await store.put_chunk(sha, data, ["team-a-*"])
            assert await store.missing([sha], principal) == []
            assert sha not in await store.collect()  # the periodic collection, just after
            assert (await store.commit("team-a-x", files, 8 << 20)).version == 1
        finally:
            await store.mirror.stop()
            await nc.close()  # type: ignore[attr-defined]

    asyncio.run(scenario())
