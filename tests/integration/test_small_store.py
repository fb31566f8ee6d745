"""A platform starts on a nats-server whose file storage is smaller than Ember's storage limits add up to (by
default nats-server offers 75% of the free disk): every store, the control plane's own buckets too, is made with
as much as the server can reserve, saying so. Before, a bucket made apart from the standard stores (the served
model names', the owners') with a plain create failed the control plane's start once the big stores had taken
the room (CI saw it on a machine whose disk had filled up)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.natsconn import connect
from support.platform import TestPlatform

from ember.dev import embedded
from ember.wire import subjects

pytestmark = pytest.mark.integration


def test_the_platform_starts_on_a_server_with_little_file_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(embedded, "NATS_CONFIG", embedded.NATS_CONFIG + "jetstream { max_file_store: 10GB }\n")
    with TestPlatform(tmp_path / "state") as platform:
        async def sizes() -> dict[str, int]:
            nc = await connect(platform.nats_url)
            try:
                js = nc.jetstream()
                return {b: (await js.stream_info(f"KV_{b}")).config.max_bytes
                        for b in (subjects.MODELS_BUCKET, subjects.OWNERS_BUCKET)}
            finally:
                await nc.close()

        made = asyncio.run(sizes())
        log = (platform.log_dir / "platform.log").read_text()
    assert all(size > 0 for size in made.values()), made
    assert "could not reserve" in log  # the big stores were cut down, and it said so
