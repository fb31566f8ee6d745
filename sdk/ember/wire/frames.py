"""Frames: several calls or answers in one NATS message, cut to stay within the server's message limit."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K")

FRAME_ITEM_OVERHEAD_BYTES = 512  # an Invocation's or Answer's fields beside its input or output, generously


def split_frames(items: list[T], sizes: list[int], limit: int) -> list[list[T]]:
    """``items`` in order, cut into frames that stay within ``limit`` bytes (a NATS message's maximum),
    counting each item as its size plus ``FRAME_ITEM_OVERHEAD_BYTES``; an item too large for any frame goes
    alone (and its publish fails)."""
    frames: list[list[T]] = []
    current: list[T] = []
    used = 0
    for item, size in zip(items, sizes, strict=True):
        size += FRAME_ITEM_OVERHEAD_BYTES
        if current and used + size > limit:
            frames.append(current)
            current, used = [], 0
        current.append(item)
        used += size
    if current:
        frames.append(current)
    return frames


class Outbox(Generic[K, T]):
    """Items queued per destination during one turn of the event loop, handed to ``send`` together once the turn
    is over: what a turn produces for one subject or inbox then travels in one frame (see ``split_frames``).

    ``send`` may return an awaitable (the publishing); the outbox runs it in a task it owns, and ``drain`` waits
    for those. Used on both sides of a synchronous call: the gateway's router sends invocations, the replica
    sends answers."""

    def __init__(self, send: Callable[[dict[K, list[T]]], Awaitable[None] | None]) -> None:
        self._send = send
        self._queued: dict[K, list[T]] = {}
        self._sending: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """Items queued and not yet handed to ``send``."""
        return sum(map(len, self._queued.values()))

    def put(self, key: K, item: T) -> None:
        if not self._queued:
            asyncio.get_running_loop().call_soon(self.flush)
        self._queued.setdefault(key, []).append(item)

    def flush(self) -> None:
        """Hand what is queued to ``send`` now (the end of the turn calls this by itself)."""
        if not self._queued:
            return
        queued, self._queued = self._queued, {}
        sending = self._send(queued)
        if sending is not None:
            task = asyncio.ensure_future(sending)
            self._sending.add(task)  # the loop holds only a weak reference to a task
            task.add_done_callback(self._sending.discard)

    async def drain(self) -> None:
        """Send what is queued now and wait until everything handed over has been sent."""
        self.flush()
        await asyncio.gather(*self._sending, return_exceptions=True)
