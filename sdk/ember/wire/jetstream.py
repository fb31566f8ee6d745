"""NATS plumbing shared by the platform and the runtime (never imported by ``import ember``).

One place connects, creates the JetStream buckets, and mirrors a KV bucket into a local dict.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import nats
from nats import errors as nats_errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, BucketNotFoundError
from nats.js.errors import NotFoundError as JsNotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from ember.wire import subjects
from ember.wire.kvmirror import KVMirror as KVMirror  # (its home before it had its own module)
from ember.wire.natscreds import NatsCredentials

T = TypeVar("T")
log = logging.getLogger("ember.nats")

REPLICA_TTL_S = 15.0  # a replica or node that stops heartbeating disappears from KV after this
NODE_TTL_S = 15.0
NODE_HEARTBEAT_S = 3.0  # how often a node agent reports; the scheduler counts a node lost after 3 missed reports
NODE_LOST_S = 3 * NODE_HEARTBEAT_S
CALL_TTL_S = 24 * 3600.0  # how long an asynchronous call's status and result are kept
DEAD_LETTER_TTL_S = 7 * 24 * 3600.0
LOG_TTL_S = 7 * 24 * 3600.0  # replicas' output lines kept at most this long
DUPLICATE_WINDOW_S = 120.0  # a resubmitted call id within this window is stored once
# A large result outlives its record (written just after it) by this much, never the other way round.
RESULTS_TTL_S = CALL_TTL_S + 300.0
RESULT_CHUNK_BYTES = 256 * 1024  # a large output is kept in chunks of this size (``ember_results``)
MiB = 1024 * 1024
GiB = 1024 * MiB
INSUFFICIENT_STORAGE = 10047  # JetStream's err_code: the server cannot reserve a stream's max_bytes
MIN_FALLBACK_BYTES = MiB  # halving a limit that the server cannot reserve stops here


async def connect(url: str, name: str, creds: NatsCredentials | None = None, *,
                  wait_s: float = 0.0) -> Client:
    """Connect as ``creds`` with reconnects forever: a platform or agent outlives a NATS restart. ``url`` may list
    several servers of a cluster, comma-separated; the client moves to another when one goes (and learns the
    others from the cluster). Errors the server sends later, such as a permissions violation, are logged.

    The first connection is tried again for ``wait_s`` seconds (-1: until it succeeds): a node agent or replica
    is admitted by a control plane (the auth callout), which may not be up yet."""
    async def on_error(exc: Exception) -> None:
        log.warning("nats: %s", exc)

    servers = [u.strip() for u in url.split(",") if u.strip()]
    options = creds.connect_options() if creds is not None else {}
    deadline = asyncio.get_running_loop().time() + wait_s
    said = False
    while True:
        try:
            return await nats.connect(servers=servers, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                                      error_cb=on_error, connect_timeout=5, **options)
        except (nats_errors.Error, OSError, TimeoutError) as exc:
            if wait_s >= 0 and asyncio.get_running_loop().time() >= deadline:
                raise
            if not said:
                log.warning("cannot connect to NATS yet (%s: %s); trying again", type(exc).__name__, exc)
                said = True
            await asyncio.sleep(0.5)


async def connect_until(stop: asyncio.Event, url: str, name: str, creds: NatsCredentials | None = None, *,
                        wait_s: float = 0.0) -> Client | None:
    """``connect``, or None once ``stop`` is set first: a refused connection is tried again for ``wait_s``, which a
    process told to stop (a replica, say, whose agent would kill it at the end of its grace) does not wait out."""
    connecting = asyncio.ensure_future(connect(url, name, creds, wait_s=wait_s))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({connecting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not connecting.done():
        connecting.cancel()
        return None
    return connecting.result()


def js_replicas() -> int:
    """How many servers hold each stream, bucket and object store (``EMBER_JS_REPLICAS``): 1 on a single server,
    3 on a three-server cluster, so that losing one server loses nothing."""
    raw = os.environ.get("EMBER_JS_REPLICAS", "1").strip() or "1"
    if raw not in ("1", "2", "3", "4", "5"):
        raise ValueError(f"EMBER_JS_REPLICAS={raw!r} is a number of servers from 1 to 5")
    return int(raw)


APP_SHARE = 4  # an app's queued calls may hold a quarter of the calls' queue unless set otherwise


@dataclass(frozen=True)
class StorageLimits:
    """How much each stream, KV bucket and object store may hold; -1 is no limit.

    Each field is read from ``EMBER_<FIELD NAME IN CAPITALS>`` by ``from_env`` (for example
    ``EMBER_CALLS_STREAM_MAX_BYTES``). A work queue or bucket that is full refuses new writes (JetStream's
    discard=new: a submit fails, nothing queued is dropped); the dead letters drop their oldest instead.
    """

    calls_stream_max_bytes: int = GiB  # EMBER_CALLS: queued calls
    calls_stream_max_msgs: int = 1_000_000
    # what one app's queued calls may hold of EMBER_CALLS (past it, its spawns get a 429; ``calls.shares``): unset,
    # a quarter of the two above (of what EMBER_CALLS_STREAM_MAX_BYTES / _MAX_MSGS set)
    calls_stream_max_bytes_per_app: int = GiB // APP_SHARE
    calls_stream_max_msgs_per_app: int = 1_000_000 // APP_SHARE
    dead_stream_max_bytes: int = 256 * MiB  # EMBER_DEAD: dead letters (also kept at most DEAD_LETTER_TTL_S)
    calls_kv_max_bytes: int = GiB  # ember_calls: records and inline results (kept CALL_TTL_S)
    results_store_max_bytes: int = 4 * GiB  # ember_results: large results (kept RESULTS_TTL_S)
    bundles_store_max_bytes: int = 16 * GiB  # ember_bundles (unreferenced ones are collected by the platform)
    control_kv_max_bytes: int = 64 * MiB  # each of ember_deployments, ember_assignments, ember_nodes, ember_replicas
    control_kv_max_value_bytes: int = 4 * MiB  # one value in those four buckets
    logs_stream_max_bytes: int = 128 * MiB  # EMBER_LOGS: replicas' output (also kept at most LOG_TTL_S)
    tokens_kv_max_bytes: int = 16 * MiB  # ember_tokens: bearer tokens' records (a few hundred bytes each)
    quotas_kv_max_bytes: int = 4 * MiB  # ember_quotas: quotas (a few hundred bytes each)
    secrets_kv_max_bytes: int = 16 * MiB  # ember_secrets: secrets, encrypted (at most 64 KiB each)
    subject_grants_kv_max_bytes: int = 4 * MiB  # ember_subject_grants: subject grants (a few hundred bytes each)
    owners_kv_max_bytes: int = 64 * MiB  # ember_owners: who uploaded each bundle, chunk and lock (control plane's)
    volumes_kv_max_bytes: int = 256 * MiB  # ember_volumes: volumes' versions (their files and chunks' hashes)
    volumes_kv_max_value_bytes: int = 8 * MiB  # one version's manifest (about 100,000 chunks)
    volume_chunks_store_max_bytes: int = 16 * GiB  # ember_volume_chunks: volumes' contents
    # EMBER_CALLS' durable consumers: one per function and one per kept version of it (nats-server 2.15 gives a stream
    # that sets none 1,000, about 500 apps of one function; it reads -1 as that default too, so -1 here is 2**31 - 1)
    calls_stream_max_consumers: int = 100_000
    # each function's event stream (on=): its events waiting; full, it refuses new ones (POST /v1/events: 429)
    events_stream_max_bytes: int = 256 * MiB
    events_stream_max_msgs: int = 1_000_000

    @staticmethod
    def env_name(field_name: str) -> str:
        return f"EMBER_{field_name.upper()}"

    @classmethod
    def from_env(cls) -> StorageLimits:
        """The defaults, overridden by whichever ``EMBER_..._MAX_...`` variables are set."""
        values: dict[str, int] = {}
        for f in fields(cls):
            name = cls.env_name(f.name)
            raw = os.environ.get(name, "").strip()
            if not raw:
                continue
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a whole number") from None
            if value == 0 or value < -1:
                raise ValueError(f"{name}={value} must be positive, or -1 for no limit")
            values[f.name] = value
        for whole in ("calls_stream_max_bytes", "calls_stream_max_msgs"):
            if whole in values and f"{whole}_per_app" not in values:  # an app's share follows the stream's limit
                values[f"{whole}_per_app"] = values[whole] if values[whole] < 0 else max(1, values[whole] // APP_SHARE)
        return cls(**values)

    def events(self) -> dict[str, Any]:  # of every function's event stream
        return {"max_bytes": self.events_stream_max_bytes, "max_msgs": self.events_stream_max_msgs,
                "discard": DiscardPolicy.NEW}

    def streams(self) -> dict[str, dict[str, Any]]:
        """The limits of every stream behind Ember's streams, buckets and object stores, by stream name."""
        control = {"max_bytes": self.control_kv_max_bytes, "max_msg_size": self.control_kv_max_value_bytes}
        return {
            subjects.CALLS_STREAM: {"max_bytes": self.calls_stream_max_bytes, "max_msgs": self.calls_stream_max_msgs,
                                    "discard": DiscardPolicy.NEW,
                                    "max_consumers": self.calls_stream_max_consumers
                                    if self.calls_stream_max_consumers > 0 else 2**31 - 1},
            subjects.DEAD_STREAM: {"max_bytes": self.dead_stream_max_bytes, "discard": DiscardPolicy.OLD},
            subjects.LOGS_STREAM: {"max_bytes": self.logs_stream_max_bytes, "discard": DiscardPolicy.OLD},
            # Direct gets: the control planes read the records by key. No rollups in a bucket that replicas or
            # node agents write (``NO_ROLLUPS``).
            kv_stream(subjects.CALLS_BUCKET): {"max_bytes": self.calls_kv_max_bytes, "allow_direct": True,
                                               **NO_ROLLUPS},
            kv_stream(subjects.TOKENS_BUCKET): {"max_bytes": self.tokens_kv_max_bytes, "max_msg_size": 64 * 1024},
            kv_stream(subjects.QUOTAS_BUCKET): {"max_bytes": self.quotas_kv_max_bytes, "max_msg_size": 64 * 1024},
            kv_stream(subjects.SECRETS_BUCKET): {"max_bytes": self.secrets_kv_max_bytes, "max_msg_size": 128 * 1024},
            kv_stream(subjects.SUBJECT_GRANTS_BUCKET): {"max_bytes": self.subject_grants_kv_max_bytes,
                                                        "max_msg_size": 64 * 1024},
            **{kv_stream(bucket): control for bucket in CONTROL_BUCKETS},
            **{kv_stream(bucket): {**control, **NO_ROLLUPS} for bucket in NODE_WRITTEN_BUCKETS},
            kv_stream(subjects.RESULTS_BUCKET): {"max_bytes": self.results_store_max_bytes, "max_age": RESULTS_TTL_S,
                                                 "max_msg_size": RESULT_CHUNK_BYTES + 4096, "allow_direct": True,
                                                 **NO_ROLLUPS},
            object_stream(subjects.BUNDLES_STORE): {"max_bytes": self.bundles_store_max_bytes},
            kv_stream(subjects.VOLUMES_BUCKET): {"max_bytes": self.volumes_kv_max_bytes,
                                                 "max_msg_size": self.volumes_kv_max_value_bytes},
            object_stream(subjects.VOLUME_CHUNKS_STORE): {"max_bytes": self.volume_chunks_store_max_bytes},
            # created by the control plane alone (``control.owners``), not by ``ensure_buckets``: no node opens it
            kv_stream(subjects.OWNERS_BUCKET): {"max_bytes": self.owners_kv_max_bytes, "max_msg_size": 64 * 1024},
        }


CONTROL_BUCKETS = (subjects.DEPLOYMENTS_BUCKET, subjects.ASSIGNMENTS_BUCKET)
NODE_WRITTEN_BUCKETS = (subjects.NODES_BUCKET, subjects.REPLICAS_BUCKET)  # node agents write their own keys
# A bucket that a replica or a node agent writes keys of (its own only) takes no rollup: a write with the header
# ``Nats-Rollup: all``, which its permissions cannot tell from another, would purge every other key of the bucket
# (every app's call records, every node's replicas). Its own keys are removed with a delete marker instead.
NO_ROLLUPS = {"allow_rollup_hdrs": False}


def kv_stream(bucket: str) -> str:
    """The stream behind a KV bucket."""
    return f"KV_{bucket}"


def object_stream(bucket: str) -> str:
    """The stream behind an object store."""
    return f"OBJ_{bucket}"


@dataclass(frozen=True)
class Stores:
    """Ember's JetStream buckets and object stores, opened (see ``ensure_buckets``)."""

    deployments: KeyValue  # <app> -> wire.Deployment
    replicas: KeyValue  # <replica id> -> wire.ReplicaStatus (TTL: REPLICA_TTL_S)
    nodes: KeyValue  # <node id> -> wire.NodeInfo (TTL: NODE_TTL_S)
    assignments: KeyValue  # <node id> -> wire.NodeAssignment
    calls: KeyValue  # s.<app>.<call id> / r.<app>.<call id> -> wire.CallRecord (see callstore)
    bundles: ObjectStore  # <sha256> -> bundle archive
    results: KeyValue  # <app>.<call id>.<writer>.<n> -> chunk n of an output too large for a record
    tokens: KeyValue  # <token id> -> wire.StoredToken (read and written by the control plane only)
    quotas: KeyValue  # <quota name> -> wire.Quota (read and written by the control plane only)
    secrets: KeyValue  # <secret name> -> wire.StoredSecret, values encrypted (the control plane only)
    subject_grants: KeyValue  # <sha256 of a pattern> -> wire.grants.SubjectGrant (the control plane only)
    volumes: KeyValue  # <volume>.<version> -> wire.VolumeVersion
    volume_chunks: ObjectStore  # <sha256> -> one chunk of a volume's file


def call_buckets(js: JetStreamContext) -> tuple[KeyValue, KeyValue]:
    """``ember_calls`` and ``ember_results`` as a replica opens them: by name, with direct gets, without asking the
    server about the streams (a replica may not: a stream's info would list every app's keys)."""
    return tuple(KeyValue(name=bucket, stream=kv_stream(bucket), pre=f"$KV.{bucket}.", js=js, direct=True)
                 for bucket in (subjects.CALLS_BUCKET, subjects.RESULTS_BUCKET))  # type: ignore[return-value]


def node_buckets(js: JetStreamContext) -> tuple[KeyValue, KeyValue]:
    """``ember_nodes`` and ``ember_replicas`` as a node agent opens them: by name, to write its own keys, without
    asking the server about the streams (a node may not: a stream's info lists every key it holds)."""
    return tuple(KeyValue(name=bucket, stream=kv_stream(bucket), pre=f"$KV.{bucket}.", js=js, direct=False)
                 for bucket in (subjects.NODES_BUCKET, subjects.REPLICAS_BUCKET))  # type: ignore[return-value]


class BucketsMissingError(RuntimeError):
    """Ember's buckets are not there yet, and this process may not create them (only the control plane may)."""


async def ensure_buckets(js: JetStreamContext, limits: StorageLimits | None = None, *, create: bool = True) -> Stores:
    """Create (or open) Ember's streams, KV buckets and object stores; idempotent.

    What is created gets ``limits`` (``StorageLimits.from_env()`` when not given), the smallest first, so that
    on a server with little file storage the big stores are the ones cut down (see ``reserving``). What exists
    is opened as it is: only the platform brings existing ones to its limits (``apply_limits``), so that
    processes started with other settings never undo each other's. With ``create`` false (a node agent or a
    replica, whose NATS permissions allow opening but not creating), ``BucketsMissingError`` names what is missing.
    """
    lim = (limits or StorageLimits.from_env()).streams()
    copies = js_replicas()

    def kv(bucket: str, **config: Any) -> _Opener:
        wanted = lim[kv_stream(bucket)]

        async def make(max_bytes: int) -> KeyValue:
            made = await js.create_key_value(bucket=bucket, max_bytes=max_bytes,
                                             max_value_size=wanted.get("max_msg_size", -1), replicas=copies, **config)
            if wanted.get("allow_rollup_hdrs") is False:  # nats-py makes every bucket with rollups allowed
                stream = (await js.stream_info(kv_stream(bucket))).config
                await js.update_stream(stream.evolve(allow_rollup_hdrs=False))
            return made

        return (kv_stream(bucket), lambda: js.key_value(bucket), make)

    def objects(bucket: str) -> _Opener:
        wanted = lim[object_stream(bucket)]
        return (object_stream(bucket), lambda: js.object_store(bucket), lambda max_bytes: js.create_object_store(
            bucket, max_bytes=max_bytes, ttl=wanted.get("max_age"), storage=StorageType.FILE, replicas=copies))

    def stream(config: StreamConfig) -> _Opener:
        config = config.evolve(**lim[config.name or ""], num_replicas=copies)
        return (config.name or "", lambda: js.stream_info(config.name or ""),
                lambda max_bytes: js.add_stream(config.evolve(max_bytes=max_bytes)))

    openers = [
        kv(subjects.DEPLOYMENTS_BUCKET, history=5),
        kv(subjects.REPLICAS_BUCKET, ttl=REPLICA_TTL_S),
        kv(subjects.NODES_BUCKET, ttl=NODE_TTL_S),
        kv(subjects.ASSIGNMENTS_BUCKET, storage=StorageType.FILE),
        kv(subjects.CALLS_BUCKET, ttl=CALL_TTL_S, storage=StorageType.FILE, direct=True),
        kv(subjects.TOKENS_BUCKET, storage=StorageType.FILE),
        kv(subjects.QUOTAS_BUCKET, storage=StorageType.FILE),
        kv(subjects.SECRETS_BUCKET, storage=StorageType.FILE),
        kv(subjects.SUBJECT_GRANTS_BUCKET, storage=StorageType.FILE),
        objects(subjects.BUNDLES_STORE),
        kv(subjects.RESULTS_BUCKET, ttl=RESULTS_TTL_S, storage=StorageType.FILE, direct=True),
        kv(subjects.VOLUMES_BUCKET, storage=StorageType.FILE),
        objects(subjects.VOLUME_CHUNKS_STORE),
        stream(StreamConfig(
            name=subjects.CALLS_STREAM, subjects=[subjects.CALLS_ALL], retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE, duplicate_window=DUPLICATE_WINDOW_S)),
        stream(StreamConfig(
            name=subjects.DEAD_STREAM, subjects=[subjects.DEAD_ALL], retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE, max_age=DEAD_LETTER_TTL_S)),
        stream(StreamConfig(
            name=subjects.LOGS_STREAM, subjects=[subjects.LOGS_ALL], retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE, max_age=LOG_TTL_S))]
    # All opened at once: each is a JetStream API round trip, and a replica waits for them before it serves.
    opened: list[Any] = list(await asyncio.gather(*(_open(open_) for _, open_, _ in openers)))
    missing = [i for i, found in enumerate(opened) if found is None]
    if missing and not create:
        raise BucketsMissingError(f"not created yet: {', '.join(openers[i][0] for i in missing)}")
    for i in sorted(missing, key=lambda i: _reserved(lim[openers[i][0]]["max_bytes"])):
        name, open_, make = openers[i]
        opened[i] = await _create(name, lim[name]["max_bytes"], open_, make)
    deployments, replicas, nodes, assignments, calls, tokens, quotas, secrets, subject_grants, bundles, results, \
        volumes, volume_chunks, _, _, _ = opened
    return Stores(deployments=deployments, replicas=replicas, nodes=nodes, assignments=assignments, calls=calls,
                  bundles=bundles, results=results, tokens=tokens, quotas=quotas, secrets=secrets, volumes=volumes,
                  volume_chunks=volume_chunks, subject_grants=subject_grants)


_Opener = tuple[str, Callable[[], Awaitable[Any]], Callable[[int], Awaitable[Any]]]  # stream, open, create


async def _open(open_: Callable[[], Awaitable[Any]]) -> Any:
    """What ``open_`` opens, or None when it does not exist."""
    try:
        return await open_()
    except (BucketNotFoundError, JsNotFoundError):
        return None


async def _create(name: str, max_bytes: int, open_: Callable[[], Awaitable[Any]],
                  create: Callable[[int], Awaitable[Any]]) -> Any:
    try:
        return await reserving(name, max_bytes, create)
    except APIError:
        found = await _open(open_)  # another process created it first, perhaps with other limits
        if found is None:
            raise
        return found


def _reserved(max_bytes: int) -> int:
    return max_bytes if max_bytes > 0 else 1 << 62


def limits_differ(config: StreamConfig, wanted: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The limits of ``wanted`` that ``config`` does not have: name -> (now, wanted)."""
    differ = {}
    for name, value in wanted.items():
        now = getattr(config, name)
        if name == "max_age":
            same = abs((now or 0.0) - value) < 1.0
        elif name == "discard":
            same = str(getattr(now, "value", now) or "old") == value.value
        elif isinstance(value, bool):
            same = bool(now) == value
        else:
            same = (now if now not in (None, 0) else -1) == value
        if not same:
            differ[name] = (now, value)
    return differ


async def apply_limits(js: JetStreamContext, limits: StorageLimits) -> list[str]:
    """Bring every existing stream, bucket and object store to ``limits`` and ``js_replicas()`` copies (an upgrade,
    or a server grown to a cluster, gets them); what changed, one line per stream (the platform calls this)."""
    async def one(name: str, wanted: dict[str, Any]) -> str | None:
        wanted = {**wanted, "num_replicas": js_replicas()}
        try:
            config = (await js.stream_info(name)).config
        except JsNotFoundError:
            return None
        differ = limits_differ(config, wanted)
        if not differ:
            return None
        info = await reserving(name, wanted.get("max_bytes", -1),
                                lambda max_bytes: js.update_stream(config.evolve(**{**wanted, "max_bytes": max_bytes})))
        changes = [f"{k} {now} -> {getattr(info.config, k)}" for k, (now, _) in sorted(differ.items())
                   if getattr(info.config, k) != now]  # a max_bytes the server could not reserve may stay
        return f"{name}: {', '.join(changes)}" if changes else None

    changed = await asyncio.gather(*(one(name, wanted) for name, wanted in limits.streams().items()))
    for line in filter(None, changed):
        log.info("storage limits: %s", line)
    return [line for line in changed if line]


async def create_limited_kv(js: Any, bucket: str, max_bytes: int, **config: Any) -> KeyValue:
    """``js.create_key_value(bucket, max_bytes=...)`` reserved as the standard stores are (``reserving``): a bucket
    made apart from ``open_stores`` (the control plane's own) with a plain create failed the platform's start."""
    return await reserving(kv_stream(bucket), max_bytes, lambda limit: js.create_key_value(bucket=bucket,
                                                                                           max_bytes=limit, **config))


async def reserving(name: str, max_bytes: int, attempt: Callable[[int], Awaitable[T]]) -> T:
    """``attempt(max_bytes)``; when nats-server cannot reserve that much file storage (its ``max_file_store``, by
    default 75% of the free disk), again with half as much, down to ``MIN_FALLBACK_BYTES``, saying so."""
    wanted = max_bytes
    while True:
        try:
            result = await attempt(max_bytes)
        except APIError as exc:
            if exc.err_code != INSUFFICIENT_STORAGE:
                raise
            if max_bytes // 2 < MIN_FALLBACK_BYTES:
                raise RuntimeError(
                    f"nats-server has no file storage left to reserve for {name} (wanted {wanted} bytes): Ember's "
                    "storage limits (EMBER_..._MAX_BYTES, see StorageLimits) add up to more than its max_file_store "
                    "(by default 75% of the free disk); lower them or give nats-server more disk") from exc
            max_bytes //= 2
            continue
        if max_bytes != wanted:
            log.warning("nats-server could not reserve %d bytes for %s; it holds at most %d: lower the "
                        "EMBER_..._MAX_BYTES limits (see StorageLimits) or raise nats-server's max_file_store",
                        wanted, name, max_bytes)
        return result
