"""Bundle collection: a bundle in the ``ember_bundles`` object store that no kept version of any app uses, and
that was not uploaded recently, is deleted.

Kept: the bundle of every current deployment, of every version still in the ``ember_deployments`` history of an
app that is deployed (its last ``EMBER_DEPLOYMENTS`` history entries), and of every slot or zygote assigned to a
node. An app that was deleted keeps none. A bundle uploaded in the last ``grace_s`` is kept whatever it is for:
``ember push`` uploads before it deploys. ``unreferenced`` decides, a pure function; ``collect_bundles`` reads
the store and the history and deletes (with the record of who uploaded each, ``control.owners``);
``BundleCollector`` runs it from the control loop every ``interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NotFoundError as JsNotFound
from nats.js.errors import ObjectNotFoundError
from nats.js.kv import KV_DEL, KV_PURGE

from ember._loop import cancel_and_wait
from ember.wire import deployment_decoder
from ember.wire.jetstream import StorageLimits, Stores, apply_limits
from ember.wire.kvmirror import SETTLE_S, last_sequence
from ember_platform.control.owners import Owners

log = logging.getLogger("ember.control.bundles")
GC_INTERVAL_S = 300.0  # how often the control loop collects (EMBER_BUNDLE_GC_INTERVAL_S)
GC_GRACE_S = 1800.0  # a bundle uploaded this recently is never collected (EMBER_BUNDLE_GC_GRACE_S)


@dataclass(frozen=True)
class StoredBundle:
    """One object of the bundles' store."""

    sha256: str
    uploaded_at: float  # epoch seconds; +inf when unknown (then it is never collected)


@dataclass(frozen=True)
class HistoryEntry:
    """One entry of the deployments' KV history."""

    app: str
    revision: int
    bundle_sha256: str | None  # None: the app was deleted (a delete or purge marker)


def kept_bundles(history: Iterable[HistoryEntry]) -> set[str]:
    """The bundles of every version in the history of an app whose last entry is not a deletion."""
    by_app: dict[str, list[HistoryEntry]] = {}
    for entry in history:
        by_app.setdefault(entry.app, []).append(entry)
    kept: set[str] = set()
    for entries in by_app.values():
        entries.sort(key=lambda e: e.revision)
        if entries[-1].bundle_sha256 is None:
            continue
        kept.update(e.bundle_sha256 for e in entries if e.bundle_sha256)
    return kept


def unreferenced(stored: Iterable[StoredBundle], referenced: set[str], now: float, grace_s: float) -> list[str]:
    """The bundles to delete: in the store, used by nothing in ``referenced``, and older than ``grace_s``."""
    return sorted(b.sha256 for b in stored
                  if b.sha256 not in referenced and now - b.uploaded_at >= grace_s)


def upload_time(mtime: str | None) -> float:
    """An object's ``mtime`` (RFC 3339) as epoch seconds; +inf when it is missing or unreadable."""
    if not mtime:
        return float("inf")
    text = mtime.strip().replace("Z", "+00:00")
    if "." in text:  # Go writes nanoseconds; Python reads at most microseconds
        head, _, tail = text.partition(".")
        digits = len(tail) - len(tail.lstrip("0123456789"))
        text = f"{head}.{tail[:min(digits, 6)]}{tail[digits:]}"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return float("inf")
    return parsed.timestamp() if parsed.tzinfo is not None else float("inf")


class IncompleteHistory(Exception):
    """The deployments' history could not be read whole: nothing is collected on the strength of it."""


async def read_history(stores: Stores) -> list[HistoryEntry]:
    """Every entry the deployments' bucket keeps, deletion markers included: up to its last sequence as it was when
    the read began (``kvmirror``: the watcher's word that it sent all may come first), else ``IncompleteHistory``."""
    last = await last_sequence(stores.deployments)
    watcher = await stores.deployments.watchall(include_history=True)
    entries: list[HistoryEntry] = []
    seen, marked = 0, False
    try:
        while not (marked and seen >= last):
            try:
                entry = await watcher.updates(timeout=SETTLE_S if marked else 30.0)
            except NatsTimeoutError:
                raise IncompleteHistory(f"the deployments' history was read up to {seen} of {last}") from None
            if entry is None:
                marked = True
                continue
            seen = max(seen, entry.revision or 0)
            sha: str | None = None
            if entry.operation not in (KV_DEL, KV_PURGE) and entry.value:
                try:
                    sha = deployment_decoder.decode(entry.value).bundle_sha256
                except Exception:
                    log.warning("an undecodable deployment of %s is ignored by bundle collection", entry.key)
                    continue
            entries.append(HistoryEntry(app=entry.key, revision=entry.revision or 0, bundle_sha256=sha))
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()
    return entries


async def list_bundles(stores: Stores) -> list[StoredBundle]:
    try:
        infos = await stores.bundles.list(ignore_deletes=True)
    except JsNotFound:  # an empty store
        return []
    return [StoredBundle(sha256=info.name, uploaded_at=upload_time(info.mtime)) for info in infos if info.name]


async def collect_bundles(stores: Stores, in_use: Callable[[], Iterable[str]], *, grace_s: float = GC_GRACE_S,
                          now: float | None = None,
                          forget: Callable[[str], Awaitable[None]] | None = None) -> list[str]:
    """Delete the bundles that nothing uses (``in_use()``: what the platform holds in memory now, the current
    deployments and the nodes' assignments; and what the deployments' history keeps), and ``forget`` who
    uploaded each (a later upload starts a new record); returns their sha256s."""
    stored = await list_bundles(stores)
    if not stored:
        return []
    kept = kept_bundles(await read_history(stores))
    doomed = unreferenced(stored, kept | set(in_use()), time.time() if now is None else now, grace_s)
    deleted = []
    for sha256 in doomed:
        if sha256 in set(in_use()):  # deployed while this ran
            continue
        try:
            await stores.bundles.delete(sha256)
        except (ObjectNotFoundError, JsNotFound):
            continue
        if forget is not None:
            await forget(sha256)
        deleted.append(sha256)
    if deleted:
        log.info("collected %d unused bundle(s): %s", len(deleted), ", ".join(s[:12] for s in deleted))
    return deleted


class BundleCollector:
    """Runs ``collect_bundles`` in the background at most every ``interval_s``; on its first run, it also
    brings the existing streams and buckets to the platform's storage limits (``apply_limits``)."""

    def __init__(self, stores: Stores, js: Any, in_use: Callable[[], Iterable[str]], *,
                 interval_s: float | None = None, grace_s: float | None = None,
                 limits: StorageLimits | None = None) -> None:
        self._stores, self._js, self._in_use = stores, js, in_use
        self.interval_s = interval_s if interval_s is not None else _env_s("EMBER_BUNDLE_GC_INTERVAL_S", GC_INTERVAL_S)
        self.grace_s = grace_s if grace_s is not None else gc_grace_s()
        self._limits = limits
        self._limits_applied = False
        self._next = 0.0
        self._task: asyncio.Task[None] | None = None

    def poke(self, now: float | None = None) -> None:
        """Start a collection if one is due and none is running; returns at once."""
        now = time.monotonic() if now is None else now
        if now < self._next or (self._task is not None and not self._task.done()):
            return
        self._next = now + self.interval_s
        self._task = asyncio.get_running_loop().create_task(self._once(), name="bundle-gc")

    async def _once(self) -> None:
        try:
            if not self._limits_applied:
                await apply_limits(self._js, self._limits or StorageLimits.from_env())
                self._limits_applied = True
            owners = await Owners.open(self._js)
            await collect_bundles(self._stores, self._in_use, grace_s=self.grace_s,
                                  forget=lambda sha: owners.forget("bundle", sha))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("bundle collection failed; trying again in %.0fs", self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)


def gc_grace_s() -> float:
    """How recent an upload must be to be spared whatever uses it (``EMBER_BUNDLE_GC_GRACE_S``)."""
    return _env_s("EMBER_BUNDLE_GC_GRACE_S", GC_GRACE_S)


def _env_s(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if not value >= 0:
        raise ValueError(f"{name}={raw!r} must be 0 or more seconds")
    return value
