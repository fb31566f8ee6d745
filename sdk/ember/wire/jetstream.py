"""NATS plumbing shared by the platform and the runtime (never imported by ``import ember``).

One place connects, creates the JetStream buckets, and mirrors a KV bucket into a local dict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BucketNotFoundError
from nats.js.errors import NotFoundError as JsNotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue
from nats.js.object_store import ObjectStore

from ember.wire import subjects

T = TypeVar("T")
log = logging.getLogger("ember.nats")

REPLICA_TTL_S = 15.0  # a replica or node that stops heartbeating disappears from KV after this
NODE_TTL_S = 15.0
NODE_HEARTBEAT_S = 3.0  # how often a node agent reports; the scheduler counts a node lost after 3 missed reports
NODE_LOST_S = 3 * NODE_HEARTBEAT_S
CALL_TTL_S = 24 * 3600.0  # how long an asynchronous call's status and result are kept
DEAD_LETTER_TTL_S = 7 * 24 * 3600.0
DUPLICATE_WINDOW_S = 120.0  # a resubmitted call id within this window is stored once


async def connect(url: str, name: str) -> Client:
    """Connect with reconnects forever: a platform or agent outlives a NATS restart."""
    async def on_error(exc: Exception) -> None:
        log.warning("nats: %s", exc)

    return await nats.connect(url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                              error_cb=on_error, connect_timeout=5)


@dataclass(frozen=True)
class Stores:
    """Ember's JetStream buckets and object stores, opened (see ``ensure_buckets``)."""

    deployments: KeyValue  # <app> -> wire.Deployment
    replicas: KeyValue  # <replica id> -> wire.ReplicaStatus (TTL: REPLICA_TTL_S)
    nodes: KeyValue  # <node id> -> wire.NodeInfo (TTL: NODE_TTL_S)
    assignments: KeyValue  # <node id> -> wire.NodeAssignment
    calls: KeyValue  # s.<call id> / r.<call id> -> wire.CallRecord (see callstore)
    bundles: ObjectStore  # <sha256> -> bundle archive
    results: ObjectStore  # <call id> -> an output too large for KV


async def ensure_buckets(js: JetStreamContext) -> Stores:
    """Create (or open) Ember's streams, KV buckets and object stores; idempotent."""
    async def kv(bucket: str, **config: Any) -> KeyValue:
        try:
            return await js.key_value(bucket)
        except BucketNotFoundError:
            return await js.create_key_value(bucket=bucket, **config)

    async def objects(bucket: str) -> ObjectStore:
        try:
            return await js.object_store(bucket)
        except BucketNotFoundError:
            return await js.create_object_store(bucket)

    # All at once: each is a JetStream API round trip, and a replica waits for them before it serves.
    kv_buckets = asyncio.gather(
        kv(subjects.DEPLOYMENTS_BUCKET, history=5),
        kv(subjects.REPLICAS_BUCKET, ttl=REPLICA_TTL_S),
        kv(subjects.NODES_BUCKET, ttl=NODE_TTL_S),
        kv(subjects.ASSIGNMENTS_BUCKET, storage=StorageType.FILE),
        kv(subjects.CALLS_BUCKET, ttl=CALL_TTL_S, storage=StorageType.FILE))
    object_stores = asyncio.gather(objects(subjects.BUNDLES_STORE), objects(subjects.RESULTS_STORE))
    streams = asyncio.gather(
        _ensure_stream(js, StreamConfig(
            name=subjects.CALLS_STREAM, subjects=[subjects.CALLS_ALL], retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE, duplicate_window=DUPLICATE_WINDOW_S)),
        _ensure_stream(js, StreamConfig(
            name=subjects.DEAD_STREAM, subjects=[subjects.DEAD_ALL], retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE, max_age=DEAD_LETTER_TTL_S)))
    (deployments, replicas, nodes, assignments, calls), (bundles, results), _ = await asyncio.gather(
        kv_buckets, object_stores, streams)
    return Stores(deployments=deployments, replicas=replicas, nodes=nodes, assignments=assignments, calls=calls,
                  bundles=bundles, results=results)


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.stream_info(config.name or "")
    except JsNotFoundError:
        await js.add_stream(config)


class KVMirror(Generic[T]):
    """A local, always-current copy of a KV bucket, kept by a watcher task that this object owns."""

    def __init__(self, kv: KeyValue, decode: Callable[[bytes], T],
                 on_change: Callable[[str, T | None], None] | None = None) -> None:
        self._kv = kv
        self._decode = decode
        self._on_change = on_change
        self.items: dict[str, T] = {}
        self._revisions: dict[str, int] = {}
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"kv-mirror-{self._kv._name}")
        await self._synced.wait()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            watcher = None
            try:
                watcher = await self._kv.watchall()
                async for entry in watcher:
                    if entry is None:
                        self._synced.set()
                        continue
                    self._apply(entry)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("KV watch on %s failed; restarting it", self._kv._name)
                await asyncio.sleep(0.5)
            finally:
                if watcher is not None:
                    await asyncio.shield(_quiet_stop(watcher))

    def record(self, key: str, value: T | None, revision: int) -> None:
        """Apply this process's own write at once (read-your-writes); older watch updates are then skipped."""
        if revision < self._revisions.get(key, 0):
            return
        self._revisions[key] = revision
        if value is None:
            self.items.pop(key, None)
        else:
            self.items[key] = value

    def _apply(self, entry: KeyValue.Entry) -> None:
        value: T | None = None
        if entry.revision is not None and entry.revision < self._revisions.get(entry.key, 0):
            return
        if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
            self.record(entry.key, None, entry.revision or 0)
        else:
            try:
                value = self._decode(entry.value)
            except Exception:
                log.warning("ignoring undecodable %s/%s", self._kv._name, entry.key)
                return
            self.record(entry.key, value, entry.revision or 0)
        if self._on_change:
            self._on_change(entry.key, value)
        self.changed.set()


async def _quiet_stop(watcher: Any) -> None:
    with contextlib.suppress(Exception):
        await watcher.stop()
