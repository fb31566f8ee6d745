"""Replica output pushed to the clients that follow it (``ember logs -f``, ``GET .../logs?follow=true``).

The registry reads every line from the ``EMBER_LOGS`` stream once; each follower has a filter and a bounded queue
of the lines that match it. A follower that does not keep up loses the oldest lines it has not read, and is told
how many (a slow terminal must not make the control plane hold output without bound). A control plane serves at
most ``max_followers`` at once; one more is refused (429), not queued.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field

from ember.wire import LogLine

FOLLOWER_BUFFER = 4096  # lines a follower may fall behind before it loses the oldest
MAX_FOLLOWERS = 256  # followers one control plane serves at once
MAX_FOLLOWERS_EACH = 32  # of them, one token's (one tenant's followers left no room for the others')


@dataclass(frozen=True, slots=True)
class LogFilter:
    """Which lines a query or a follower wants: one app, and optionally one service, replica and stream, in a window
    of time (``since`` exclusive, ``until`` inclusive)."""

    app: str
    service: str | None = None
    replica: str | None = None
    stream: str | None = None
    since: float = 0.0
    until: float | None = None

    def matches(self, app: str, service: str, line: LogLine) -> bool:
        return (app == self.app and self.service in (None, service) and self.replica in (None, line.replica_id)
                and self.stream in (None, line.stream) and line.ts > self.since
                and (self.until is None or line.ts <= self.until))


@dataclass(eq=False, slots=True)
class Follower:
    """One client following the logs: the lines that matched its filter since it last read, at most ``size``."""

    filter: LogFilter
    size: int = FOLLOWER_BUFFER
    lines: deque[LogLine] = field(default_factory=deque)
    dropped: int = 0  # lines lost since the last read, because the client fell behind
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def offer(self, line: LogLine) -> None:
        if len(self.lines) >= self.size:
            self.lines.popleft()
            self.dropped += 1
        self.lines.append(line)
        self._wake.set()

    async def next_lines(self, wait_s: float) -> tuple[list[LogLine], int]:
        """The lines that arrived since the last call (waiting up to ``wait_s`` for one), and how many were lost."""
        if not self.lines:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)
        lines, dropped = list(self.lines), self.dropped
        self.lines.clear()
        self.dropped = 0
        return lines, dropped


class TooManyFollowersError(Exception):
    """This control plane already serves ``MAX_FOLLOWERS`` followers."""


class LogFeed:
    """The followers of one control plane, offered each line as the registry reads it."""

    def __init__(self, max_followers: int = MAX_FOLLOWERS, buffer: int = FOLLOWER_BUFFER,
                 max_each: int = MAX_FOLLOWERS_EACH) -> None:
        self.max_followers = max_followers
        self.max_each = max_each
        self.buffer = buffer
        self._followers: dict[Follower, str] = {}  # -> whose (a token's id)

    def __len__(self) -> int:
        return len(self._followers)

    def open(self, flt: LogFilter, holder: str = "") -> Follower:
        """A follower of the lines ``flt`` matches, for ``holder`` (a token's id), within both limits."""
        if len(self._followers) >= self.max_followers:
            raise TooManyFollowersError(f"this control plane already streams logs to {self.max_followers} clients")
        if sum(1 for h in self._followers.values() if h == holder) >= self.max_each:
            raise TooManyFollowersError(f"this token already follows {self.max_each} log streams here")
        follower = Follower(flt, self.buffer)
        self._followers[follower] = holder
        return follower

    def close(self, follower: Follower) -> None:
        self._followers.pop(follower, None)

    def publish(self, app: str, service: str, line: LogLine) -> None:
        for follower in self._followers:
            if follower.filter.matches(app, service, line):
                follower.offer(line)
