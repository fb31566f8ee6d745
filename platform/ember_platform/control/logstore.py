"""The replicas' output the control plane keeps for ``GET /v1/apps/<app>/logs``: the last lines of each (app,
service), within a cap on the bytes kept across all of them.

What is kept goes with what runs: an app's lines at its deletion (its name deployed again, perhaps by another
tenant whose pattern matches it, starts with none of them), a service's once no running version of its app has it,
and a line that names neither is not kept (a replica draining after its app's deletion). Beyond the cap
(``EMBER_LOG_BYTES_KEPT``, 64 MiB by default) the oldest lines of the (app, service) that holds the most go first:
an app that logs much cannot push out every other's last lines, and app names churned under one pattern cannot
grow memory without bound.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Collection

from ember.wire import Deployment, LogLine
from ember_platform.control.logfeed import LogFilter

DEFAULT_BYTES_KEPT = 64 * 1024 * 1024
LOW_WATER = 0.9  # a cap exceeded sheds down to this share of it
LINE_OVERHEAD = 160  # bytes a kept line costs besides its text (the struct, its ids and its place in the deque)
Key = tuple[str, str]  # (app, service)


def bytes_kept() -> int:
    """The cap on the bytes kept across every (app, service), from ``EMBER_LOG_BYTES_KEPT``."""
    return int(os.environ.get("EMBER_LOG_BYTES_KEPT", DEFAULT_BYTES_KEPT))


def running_services(dep: Deployment | None) -> set[str]:
    """The services of ``dep``'s running versions (none for an app not deployed): those whose lines are kept."""
    if dep is None:
        return set()
    return {svc.name for v in dep.running() if (at := dep.release(v)) is not None for svc in at.manifest.services}


def size(line: LogLine) -> int:
    """What ``line`` counts for against the cap."""
    return len(line.line) + len(line.replica_id) + LINE_OVERHEAD


class LogStore:
    """The last ``lines_kept`` lines of each (app, service), at most ``max_bytes`` in all."""

    def __init__(self, lines_kept: int, max_bytes: int | None = None) -> None:
        self.lines_kept = lines_kept
        self.max_bytes = bytes_kept() if max_bytes is None else max_bytes
        self._lines: dict[Key, deque[LogLine]] = {}
        self._bytes: dict[Key, int] = {}
        self.total = 0  # bytes kept, as ``size`` counts them

    def add(self, app: str, service: str, line: LogLine) -> None:
        key = (app, service)
        kept = self._lines.setdefault(key, deque())
        if len(kept) >= self.lines_kept:
            self._forget(key, kept.popleft())
        kept.append(line)
        self._bytes[key] = self._bytes.get(key, 0) + size(line)
        self.total += size(line)
        if self.total > self.max_bytes:
            self._shed()

    def lines(self, flt: LogFilter, limit: int) -> list[LogLine]:
        """The last ``limit`` kept lines that ``flt`` wants, oldest first."""
        found = [line for (a, s), kept in self._lines.items() if a == flt.app and flt.service in (None, s)
                 for line in kept if flt.matches(a, s, line)]
        found.sort(key=lambda line: line.ts)
        return found[-limit:]

    def keep(self, app: str, services: Collection[str]) -> None:
        """Drop ``app``'s lines but those of ``services`` (none: the app was deleted)."""
        for key in [k for k in self._lines if k[0] == app and k[1] not in services]:
            self._drop(key)

    def keys(self) -> list[Key]:
        return list(self._lines)

    def _drop(self, key: Key) -> None:
        del self._lines[key]
        self.total -= self._bytes.pop(key)

    def _forget(self, key: Key, line: LogLine) -> None:
        self._bytes[key] -= size(line)
        self.total -= size(line)

    def _shed(self) -> None:
        """Down to ``LOW_WATER`` of the cap: the biggest (app, service)s cut to one level, their oldest lines first,
        the level as high as frees enough (one sort of the sizes frees a tenth of the cap, not one line)."""
        excess = self.total - int(self.max_bytes * LOW_WATER)
        sizes = sorted(self._bytes.values(), reverse=True)
        level, top = 0, 0
        for i, held in enumerate(sizes, 1):
            top += held
            below = sizes[i] if i < len(sizes) else 0
            if top - i * below >= excess:  # cutting these ``i`` to ``below`` would free enough: to ``level`` does
                level = (top - excess) // i
                break
        for key in [k for k, held in self._bytes.items() if held > level]:
            kept = self._lines[key]
            while kept and self._bytes[key] > level:
                self._forget(key, kept.popleft())
            if not kept:
                self._drop(key)
