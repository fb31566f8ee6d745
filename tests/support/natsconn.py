"""Tests that talk to NATS directly act as the control plane: with its credentials (Ember's NATS admits no
anonymous client). ``remember`` is told each server's credentials when it starts; ``connect`` finds them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from typing import Any

import nats
from nats.js.errors import KeyNotFoundError

from ember.wire.natscreds import NatsCredentials

_CREDENTIALS: dict[str, NatsCredentials] = {}


def remember(url: str, creds: NatsCredentials) -> None:
    for server in url.split(","):
        _CREDENTIALS[server.strip()] = creds


async def connect(url: str = "", *, servers: list[str] | None = None, **options: Any) -> nats.NATS:
    """``nats.connect`` to ``url`` (or ``servers``) as the control plane of the Ember that runs there."""
    listed = servers or [u.strip() for u in url.split(",")]
    creds = next((_CREDENTIALS[u] for u in listed if u in _CREDENTIALS), None)
    return await nats.connect(servers=listed, **(creds.connect_options() if creds else {}), **options)


async def kv_value(url: str, bucket: str, key: str) -> bytes | None:
    """The value of ``key`` in KV ``bucket`` of the Ember at ``url``, read as its control plane; None if absent."""
    nc = await connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        try:
            return (await kv.get(key)).value
        except KeyNotFoundError:
            return None
    finally:
        await nc.close()


async def all_keys(bucket: Any, under: str = ">") -> list[str]:
    """Every key of a KV ``bucket`` (those matching ``under``, a key filter with wildcards): the subjects its stream
    holds, less those whose last entry deleted or purged the key. Exact: nats-py's key listing is a watch that may
    end early (or time out) on a loaded machine, which read as "fewer keys" failed tests that compare key lists and
    could pass one that waits for keys to go."""
    info = await bucket._js.stream_info(bucket._stream, subjects_filter=f"{bucket._pre}{under}")
    keys = []
    for key in (subject[len(bucket._pre):] for subject in (info.state.subjects or {})):
        with contextlib.suppress(KeyNotFoundError):  # its last entry removed it
            await bucket.get(key)
            keys.append(key)
    return keys


async def ends_refused(attempt: Awaitable[Any], errors: Sequence[object]) -> bool:
    """Await ``attempt`` (a NATS request the server should refuse) until it ends or the server's word of a refusal
    reaches ``errors`` (what the connection's error callback collects): True when refused, that way or by going
    unanswered to its timeout; False when it was answered. Any other error is raised as itself."""
    said = len(errors)
    asked = asyncio.ensure_future(attempt)
    while not asked.done() and len(errors) == said:
        await asyncio.sleep(0.005)
    if not asked.done():
        asked.cancel()
        await asyncio.gather(asked, return_exceptions=True)
        return True
    try:
        asked.result()
    except nats.errors.TimeoutError:
        await asyncio.sleep(0.2)  # the server says why asynchronously
        return True
    return False
