"""What the node agent reads, asked of a control plane (``ember.node.<node id>.fetch``, ``ember.wire.nodereads``):
its own assignment, and the bundles, volume versions and chunks assigned to it. The node's NATS permissions open
no store to it: a control plane checks each read against the node's assignment and answers in pieces, which are
asked for several at a time. What comes back is checked by the caller (bundles and chunks by their sha256).

The assignment: the node subscribes to its own key's subject in ``ember_assignments`` (each write arrives as a
plain message, no consumer) and asks for the current value at its start and every ``RESYNC_S`` (a write may be
missed while the connection is down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.msg import Msg

from ember._loop import cancel_and_wait
from ember.wire import NodeAssignment, assignment_decoder, encoder, subjects
from ember.wire.nodereads import ERROR_HEADER, SIZE_HEADER, FetchKind, FetchRequest

log = logging.getLogger("ember.agent.fetch")
AHEAD = 4  # pieces in flight per read
REQUEST_TIMEOUT_S = 30.0
RESYNC_S = 10.0  # a write missed while the connection was down is seen within this
RETRY_S = 1.0  # until the first read succeeds (a control plane that just created the buckets may not answer yet)


class NotFetched(Exception):
    """The control plane would not answer it (not assigned to this node, or not stored), or none answered."""


class NodeFetcher:
    """Reads through a control plane what this node may read; ``bundle``, ``volume`` and ``chunk`` give bytes."""

    def __init__(self, nc: Any, node_id: str) -> None:
        self._nc = nc
        self._subject = subjects.node_fetch(node_id)
        self._grants: dict[str, str] = {}  # bundle sha256 -> the grant of a build that reads it

    def allow(self, sha256: str, grant: str) -> None:
        """Read bundle ``sha256`` with ``grant`` (a build request's): any control plane then answers it."""
        if grant:
            self._grants[sha256] = grant

    async def bundle(self, sha256: str) -> bytes:
        return await self.fetch("bundle", sha256)

    async def volume(self, key: str) -> bytes:
        """A volume version's record (``<volume>.<version>``), as ``ember_volumes`` holds it."""
        return await self.fetch("volume", key)

    async def chunk(self, sha256: str) -> bytes:
        return await self.fetch("chunk", sha256)

    async def fetch(self, kind: FetchKind, name: str = "") -> bytes:
        """The whole content: the first piece says its size; the others are asked ``AHEAD`` at a time."""
        first, total = await self._piece(kind, name, 0)
        if len(first) >= total:
            return first
        if not first:
            raise NotFetched(f"{kind} {name[:12]}: an empty piece of {total} bytes")
        offsets = list(range(len(first), total, len(first)))
        pieces: dict[int, bytes] = {0: first}
        gate = asyncio.Semaphore(AHEAD)

        async def one(offset: int) -> None:
            async with gate:
                pieces[offset], _ = await self._piece(kind, name, offset)

        await asyncio.gather(*(one(o) for o in offsets))
        data = b"".join(pieces[o] for o in sorted(pieces))
        if len(data) != total:
            raise NotFetched(f"{kind} {name[:12]}: {len(data)} bytes came, not {total}")
        return data

    async def _piece(self, kind: FetchKind, name: str, offset: int) -> tuple[bytes, int]:
        grant = self._grants.get(name, "") if kind == "bundle" else ""
        request = encoder.encode(FetchRequest(kind=kind, name=name, offset=offset, grant=grant))
        try:
            msg = await self._nc.request(self._subject, request, timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:
            raise NotFetched(f"{kind} {name[:12]}: no control plane answered ({type(exc).__name__})") from None
        headers = msg.headers or {}
        if headers.get(ERROR_HEADER) or SIZE_HEADER not in headers:
            raise NotFetched(f"{kind} {name[:12]}: {headers.get(ERROR_HEADER) or 'no answer'}")
        return bytes(msg.data or b""), int(headers[SIZE_HEADER])


class AssignmentWatch:
    """This node's assignment (``items``: {node id: assignment}, or empty), kept current (see the module)."""

    def __init__(self, nc: Any, node_id: str, fetcher: NodeFetcher,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self._nc = nc
        self._node_id = node_id
        self._fetcher = fetcher
        self._on_change = on_change
        self.items: dict[str, NodeAssignment] = {}
        self._synced = False  # read once since the start
        self._writes = 0  # writes heard: a read that overlapped one is dropped (the write is as new or newer)
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def synced(self) -> bool:
        """Whether this node's assignment was read since the start (what is not in it is not wanted here)."""
        return self._synced

    async def start(self) -> None:
        updates = subjects.assignment_updates(self._node_id)
        self._sub = await self._nc.subscribe(updates, cb=subjects.only_on(updates, self._on_write))
        with contextlib.suppress(NotFetched):
            await self._read()
        self._task = asyncio.create_task(self._run(), name="assignment-resync")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(RESYNC_S if self._synced else RETRY_S)
            try:
                await self._read()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cannot read this node's assignment: %s", exc)

    async def _read(self) -> None:
        before = self._writes
        raw = await self._fetcher.fetch("assignment")
        self._synced = True
        if self._writes == before:
            self._set(raw)

    async def _on_write(self, msg: Msg) -> None:
        self._writes += 1
        deleted = (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE")
        if not deleted and not msg.data:  # not a deletion: an empty answer sent here as a request's reply
            log.warning("ignoring an empty write of this node's assignment (not a deletion)")
            return
        self._set(b"" if deleted else bytes(msg.data))

    def _set(self, raw: bytes) -> None:
        try:
            value = assignment_decoder.decode(raw) if raw else None
        except msgspec.DecodeError as exc:  # written by a newer control plane, or damaged: the last good one stays
            log.warning("this node's assignment cannot be read: %s", exc)
            return
        if value == self.items.get(self._node_id):
            return
        if value is None:
            self.items.pop(self._node_id, None)
        else:
            self.items[self._node_id] = value
        self._on_change()
