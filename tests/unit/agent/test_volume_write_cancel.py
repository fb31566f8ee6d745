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

import pytest

from ember_runtime.agent.volumes import VolumeCache

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
