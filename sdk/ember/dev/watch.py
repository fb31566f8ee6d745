"""Watching an app's folder for ``ember dev --watch``: the files a push would bundle, polled for changes.

Polling (a ``stat`` of each bundled file a few times a second) needs no dependency and sees edits made in any way
(editors that write in place, that rename a temporary file over the original, ``git checkout``). A burst of
changes (an editor saving several files, a formatter rewriting one) is one change: it is reported once the
folder has been quiet for ``quiet_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ember._bundle import list_files

POLL_S = 0.2
QUIET_S = 0.3
Snapshot = dict[str, tuple[int, int]]  # relative path -> (mtime in ns, size)


def snapshot(root: Path) -> Snapshot:
    """The bundled files under ``root`` with their modification times and sizes."""
    found: Snapshot = {}
    for rel in list_files(root):
        try:
            st = (root / rel).stat()
        except OSError:  # removed while listing: the next poll sees it gone
            continue
        found[rel] = (st.st_mtime_ns, st.st_size)
    return found


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """The paths added, removed or modified between two snapshots, sorted."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def changes(root: Path, stop: threading.Event, *, poll_s: float = POLL_S, quiet_s: float = QUIET_S,
            ) -> Iterator[list[str]]:
    """Yield the files changed under ``root`` each time a burst of changes settles (``quiet_s`` without another),
    until ``stop`` is set. What changes while the caller handles one burst is reported as the next."""
    root = root.resolve()
    seen = snapshot(root)
    while not stop.wait(poll_s):
        now = snapshot(root)
        if now == seen:
            continue
        settled = time.monotonic() + quiet_s
        while time.monotonic() < settled and not stop.wait(poll_s / 2):
            later = snapshot(root)
            if later != now:
                now, settled = later, time.monotonic() + quiet_s
        if stop.is_set():
            return
        paths = changed(seen, now)
        seen = now
        if paths:
            yield paths
