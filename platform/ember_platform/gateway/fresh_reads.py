"""Reads of something that changes under the reader (every node's assignment, read again when a mirror may lag),
shared by the callers that each need one made after they asked.

A caller waits for the read that starts next: one already running began before it asked and may not see what it
looks for (a replica assigned a moment ago). Everyone who asks while that next read waits to start shares it. So at
most one read runs and one waits, whatever the number of callers: a burst of requests from replicas this control
plane does not know (a draining replica's, a forged id's) costs two reads, not one each."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
READ_TIMEOUT_S = 10.0  # a read that takes longer fails its callers (the next ones read again)


class FreshReads(Generic[T]):
    def __init__(self, read: Callable[[], Awaitable[T]]) -> None:
        self._read = read
        self._running: asyncio.Future[T] | None = None  # the read under way
        self._next: asyncio.Future[T] | None = None  # the read that starts once it ends, shared by who asked since

    async def fresh(self) -> T:
        """The result of a read that started after this call."""
        if self._next is None or self._next.done():  # (done: cancelled before it began, at a loop's end)
            self._next = asyncio.ensure_future(self._after(self._running))
        return await asyncio.shield(self._next)

    async def _after(self, running: asyncio.Future[T] | None) -> T:
        if running is not None:
            await asyncio.wait([running])  # however it ended; this task's own cancellation still goes through
        self._running, self._next = self._next, None
        try:
            return await asyncio.wait_for(self._read(), READ_TIMEOUT_S)
        finally:
            if self._running is asyncio.current_task():
                self._running = None
