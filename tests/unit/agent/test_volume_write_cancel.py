"""A volume fetch cancelled while a chunk is being written (its replica unassigned, the agent stopping): the file's
descriptor is closed only once the thread writing to it has finished, never under it (a number closed under a
writing thread can be given to another file meanwhile, which then receives the volume's bytes).

The chunks come from a stand-in for the control plane's chunk store (``source.chunk``, the one thing replaced here):
what is tested is the node's own write path (``VolumeCache._write_file``), on a real file and a real thread."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import msgspec
import pytest

from ember.wire.volumes import VolumeFile, VolumeMount, VolumeVersion
from ember_runtime.agent.volumes import VolumeCache, VolumeTooLarge

CHUNK = 512 * 1024 * 1024  # one write long enough to be caught in the middle


class _Store:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def chunk(self, sha: str) -> bytes:
        return self.data


async def _cancelled_mid_write(tmp_path: Path) -> tuple[int, int]:
    """(the file's size when the cancelled fetch had ended, its size once everything settled)."""
    data = os.urandom(1024 * 1024) * (CHUNK // (1024 * 1024))
    cache = VolumeCache(tmp_path / "cache", _Store(data), budget_bytes=1 << 40)
    target = tmp_path / "file"
    fetch = asyncio.create_task(cache._write_file(target, [hashlib.sha256(data).hexdigest()]))
    while not (target.exists() and target.stat().st_size > 0):  # the thread has begun writing
        await asyncio.sleep(0.001)
    fetch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await fetch
    ended = target.stat().st_size
    await asyncio.sleep(0.5)  # a thread left writing would go on meanwhile
    return ended, target.stat().st_size


def test_a_fetch_cancelled_mid_write_closes_its_file_only_after_the_write(tmp_path: Path) -> None:
    ended, settled = asyncio.run(_cancelled_mid_write(tmp_path))
    assert ended == settled == CHUNK, "the descriptor was closed while a thread still wrote to it"


class _OneVersion(_Store):
    def __init__(self, version: bytes) -> None:
        super().__init__(b"")
        self.version = version
        self.chunks = 0

    async def volume(self, key: str) -> bytes:
        return self.version

    async def chunk(self, sha: str) -> bytes:
        self.chunks += 1
        return await super().chunk(sha)


def test_a_version_bigger_than_the_cache_may_hold_is_never_fetched(tmp_path: Path) -> None:
    """One 8 MiB chunk named 100,000 times is a version of 781 GiB: every node that mounted it wrote all of it to its
    disk, whatever its cache's budget. Refused before any chunk is fetched."""
    sha = "0" * 64
    version = VolumeVersion(name="w", version=1, created_at=0.0, size=100_000 * 8 * 1024 * 1024,
                            files=[VolumeFile(path="w.bin", size=100_000 * 8 * 1024 * 1024, chunks=[sha] * 100_000)])
    store = _OneVersion(msgspec.json.encode(version))
    cache = VolumeCache(tmp_path / "cache", store, budget_bytes=10 * 1024**3)
    with pytest.raises(VolumeTooLarge, match="EMBER_NODE_VOLUME_CACHE_BYTES"):
        asyncio.run(cache.ensure(VolumeMount(path="/w", name="w", version=1)))
    assert store.chunks == 0 and cache.cached() == []
