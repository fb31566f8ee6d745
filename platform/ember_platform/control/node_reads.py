"""A node's reads, answered by a control plane: ``ember.node.<node id>.fetch`` (``ember.wire.nodereads``).

Only node ``<node id>`` may publish that subject (its NATS permissions, ``natsauth.permissions.node``); every
control plane answers from one queue group. A node may read its own assignment, and the bundles, volume versions
and volume chunks that the replicas and zygotes assigned to it (or a build this control plane asked of it) need:
nothing else of ``ember_bundles``, ``ember_volumes``, ``ember_volume_chunks`` or ``ember_assignments`` is open to
it, so a node cannot read another tenant's code or weights by knowing their hash, nor see what other nodes run.

What a node may not read is answered ``not found``, whether it exists or not. The check reads this control plane's
mirror of the assignments and, when the mirror says no, the bucket itself (the mirror may lag a new assignment).
A build's bundle is read with a grant: the control plane that asks a node for a build signs (node, bundle) with a
key every control plane derives from the NATS auth secret (``build_grant``), so whichever control plane answers the
node's read checks it; a node cannot forge one for another bundle. Without NATS auth (no permissions to enforce
anyway) only the control plane that asked for the build knows it. Content is answered in pieces under NATS' max
payload; what is being read is held in memory (``Blobs``, bounded) while its pieces are asked for, so that each
piece costs no read of the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError, NoKeysError, NotFoundError

from ember._loop import cancel_and_wait
from ember.wire import NodeAssignment, SlotAssignment, ZygoteAssignment, assignment_decoder, encoder, subjects
from ember.wire.jetstream import Stores, object_stream
from ember.wire.nodereads import ERROR_HEADER, NOT_FOUND, SIZE_HEADER, UNAVAILABLE, FetchRequest
from ember.wire.volumes import VolumeVersion

log = logging.getLogger("ember.node_reads")
QUEUE = "ember-node-reads"
HEADROOM = 16 * 1024  # under the max payload: the headers and the protocol's own
CACHE_BYTES = 512 * 1024**2
_request = msgspec.json.Decoder(FetchRequest)
_version = msgspec.json.Decoder(VolumeVersion)


_ABSENT = (KeyNotFoundError, NotFoundError, NoKeysError)  # and a deleted key's KeyDeletedError, a KeyNotFoundError


class NotReadable(Exception):
    """Not assigned to the node, or not stored: the node is told ``not found`` either way."""


class Blobs:
    """Contents being read by nodes, newest kept, at most ``limit`` bytes (always the newest one); one load each."""

    def __init__(self, limit: int = CACHE_BYTES) -> None:
        self._limit = limit
        self._held: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._loading: dict[tuple[str, str], asyncio.Future[bytes]] = {}

    async def get(self, key: tuple[str, str], load: Callable[[], Awaitable[bytes]]) -> bytes:
        if key in self._held:
            self._held.move_to_end(key)
            return self._held[key]
        if key not in self._loading:
            self._loading[key] = asyncio.ensure_future(load())
            self._loading[key].add_done_callback(lambda f: self._loaded(key, f))
        return await asyncio.shield(self._loading[key])

    def _loaded(self, key: tuple[str, str], future: asyncio.Future[bytes]) -> None:
        self._loading.pop(key, None)
        if future.cancelled() or future.exception() is not None:
            return
        self._held[key] = future.result()
        while len(self._held) > 1 and sum(len(b) for b in self._held.values()) > self._limit:
            self._held.popitem(last=False)


def build_grant(key: bytes, node_id: str, bundle_sha256: str) -> str:
    """What lets node ``node_id`` read a build's bundle from any control plane (signed by the one that asked)."""
    return hmac.new(key, f"build:{node_id}:{bundle_sha256}".encode(), hashlib.sha256).hexdigest()


class NodeReads:
    def __init__(self, nc: Any, stores: Stores, mirror: Callable[[], Mapping[str, NodeAssignment]],
                 builds: Callable[[str], set[str]] = lambda _node: set(), grant_key: bytes | None = None) -> None:
        self._nc = nc
        self._grant_key = grant_key  # checks a build's bundle grant (``build_grant``)
        self._stores = stores
        self._mirror = mirror  # this control plane's copy of the assignments
        self._builds = builds  # the bundles of the builds this control plane asked of a node
        self._blobs = Blobs()
        self._chunks_of: dict[str, frozenset[str]] = {}  # volume version key -> its chunks (a version never changes)
        self._tasks: set[asyncio.Task[None]] = set()
        self._sub: Any = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(subjects.NODE_FETCH_ALL, queue=QUEUE,
                                             cb=subjects.only_on(subjects.NODE_FETCH_ALL, self._on_request))

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        await cancel_and_wait(*self._tasks)

    async def _on_request(self, msg: Msg) -> None:
        """Each request in a task of its own: a large load holds up no other node's pieces."""
        if not msg.reply:
            return
        task = asyncio.get_running_loop().create_task(self._answer(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        node_id = msg.subject.split(".")[2]
        try:
            request = _request.decode(msg.data)
            content = await self.read(node_id, request)
            piece_size = max(self._nc.max_payload - HEADROOM, 64 * 1024)
            offset = max(request.offset, 0)
            piece, headers = content[offset:offset + piece_size], {SIZE_HEADER: str(len(content))}
        except (NotReadable, msgspec.DecodeError, ValueError) as exc:
            log.info("node %s asked for what it may not read: %s", node_id[:80], str(exc)[:200])
            piece, headers = b"", {ERROR_HEADER: NOT_FOUND}
        except Exception as exc:  # the stores did not answer (a timeout, a leader's election): not "none"
            log.warning("could not read what node %s asked for: %s", node_id[:80], repr(exc)[:200])
            piece, headers = b"", {ERROR_HEADER: UNAVAILABLE}
        with contextlib.suppress(Exception):
            await self._nc.publish(msg.reply, piece, headers=headers)

    async def read(self, node_id: str, request: FetchRequest) -> bytes:
        """The whole content ``request`` names, if node ``node_id`` may read it; else ``NotReadable``."""
        if request.kind == "assignment":
            return await self._assignment(node_id)
        if not await self._allowed(node_id, request):
            raise NotReadable(f"{request.kind} {request.name[:80]!r} is not assigned to node {node_id[:80]!r}")
        key = (request.kind, request.name)
        if request.kind == "volume":
            return await self._blobs.get(key, lambda: self._entry(self._stores.volumes, request.name))
        bucket = subjects.BUNDLES_STORE if request.kind == "bundle" else subjects.VOLUME_CHUNKS_STORE
        store = self._stores.bundles if request.kind == "bundle" else self._stores.volume_chunks
        return await self._blobs.get(key, lambda: self._object(store, bucket, request.name))

    async def _allowed(self, node_id: str, request: FetchRequest) -> bool:
        """Whether the node's assignment (as mirrored, else as stored now) or its builds need what it asks for."""
        if request.kind == "bundle" and (request.name in self._builds(node_id) or self._granted(node_id, request)):
            return True
        if await self._needs(self._mirror().get(node_id), request):
            return True
        raw = await self._assignment(node_id)
        return bool(raw) and await self._needs(assignment_decoder.decode(raw), request)

    async def _assignment(self, node_id: str) -> bytes:
        """The node's assignment as stored now (empty: none, or deleted). A stored entry that is no assignment and no
        deletion (a server's answer sent there as a request's reply subject, which NATS does not check) reads as
        this control plane's last good copy: read as none, it stopped every replica of the node."""
        try:
            entry = await self._stores.assignments.get(node_id)
        except _ABSENT:  # no such key, or deleted (a store that cannot answer now raises: the node keeps what it has)
            return b""
        raw = bytes(entry.value or b"")
        try:
            assignment_decoder.decode(raw)
        except msgspec.DecodeError:
            kept = self._mirror().get(node_id)
            log.warning("the stored assignment of node %s is spoiled; answering the last good one", node_id[:80])
            return encoder.encode(kept) if kept is not None else b""
        return raw

    def _granted(self, node_id: str, request: FetchRequest) -> bool:
        """Whether the request carries a control plane's grant for this node to read this build's bundle."""
        if self._grant_key is None or not request.grant:
            return False
        return hmac.compare_digest(request.grant, build_grant(self._grant_key, node_id, request.name))

    async def _needs(self, assignment: NodeAssignment | None, request: FetchRequest) -> bool:
        if assignment is None:
            return False
        holders: list[SlotAssignment | ZygoteAssignment] = [*assignment.slots, *assignment.zygotes]
        if request.kind == "bundle":
            return any(h.bundle_sha256 == request.name for h in holders)
        volumes = {f"{m.name}.{m.version}" for h in holders for m in h.volumes}
        if request.kind == "volume":
            return request.name in volumes
        for key in volumes:
            if request.name in await self._chunks(key):
                return True
        return False

    async def _chunks(self, key: str) -> frozenset[str]:
        if key not in self._chunks_of:
            try:
                version = _version.decode(await self._entry(self._stores.volumes, key))
            except (NotReadable, msgspec.DecodeError):
                return frozenset()
            if len(self._chunks_of) > 4096:
                self._chunks_of.clear()
            self._chunks_of[key] = frozenset(c for f in version.files for c in f.chunks)
        return self._chunks_of[key]

    async def _entry(self, kv: Any, key: str, allow_missing: bool = False) -> bytes:
        try:
            entry = await kv.get(key)
            return bytes(entry.value or b"")
        except Exception as exc:  # no such key, or deleted
            if allow_missing:
                return b""
            raise NotReadable(f"{key[:80]}: {type(exc).__name__}") from None

    async def _object(self, store: Any, bucket: str, name: str) -> bytes:
        return await read_object(self._nc.jetstream(), store, bucket, name)


async def read_object(js: Any, store: Any, bucket: str, name: str) -> bytes:
    """An object's messages read by direct gets, one after the other (no consumer to create: several times faster
    than the object store's own ``get``); the node checks the whole against its sha256. ``NotReadable`` if it is
    not stored."""
    try:
        info = await store.get_info(name)
        if info.deleted or not info.nuid:
            raise NotReadable(f"{name[:80]}: deleted")
        subject, seq, parts = f"$O.{bucket}.C.{info.nuid}", 1, []
        for _ in range(info.chunks or 0):
            msg = await js.get_msg(object_stream(bucket), seq=seq, subject=subject, direct=True, next=True)
            parts.append(msg.data or b"")
            seq = (msg.seq or seq) + 1
    except NotReadable:
        raise
    except Exception as exc:
        raise NotReadable(f"{name[:80]}: {type(exc).__name__}") from None
    return b"".join(parts)
