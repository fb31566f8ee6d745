"""The node's bundle cache (the artifact cache): fetched through a control plane (``agent.fetch``: only the
bundles assigned to this node), verified by sha256,
unpacked once, its weight files read ahead into the page cache, so that a replica starts from local disk.

It holds at most ``EMBER_NODE_BUNDLE_CACHE_BYTES`` (unpacked) when it can: ``evict`` removes the unpacked
bundles that were used least recently and that no replica or zygote uses (``choose_evictions``, a pure
function); a bundle in use is never removed, even over the budget.

Only the agent writes here. An unpacked bundle is made read-only (sandboxes also see it through a read-only
mount), and what it holds is recorded when it is unpacked (``tree_digest``: every entry's path, type, mode,
size and modification time, so that any write, chmod or rename shows); ``verify`` checks that record before each
fresh start and zygote build, and unpacks the bundle again when it does not match."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ember._bundle import unpack_bundle

WEIGHT_SUFFIXES = frozenset({".pt", ".pth", ".bin", ".safetensors", ".onnx", ".engine", ".plan", ".npz", ".npy"})
DEFAULT_BUDGET_BYTES = 20 * 1024**3
EVICT_EVERY_S = 60.0  # ``maybe_evict`` looks at most this often, and after every fetch
log = logging.getLogger("ember.agent.bundles")


@dataclass(frozen=True)
class CachedBundle:
    sha256: str
    size: int  # bytes unpacked
    last_used: float  # epoch seconds


def choose_evictions(cached: Iterable[CachedBundle], in_use: Collection[str], budget: int) -> list[str]:
    """The bundles to remove so that the cache holds at most ``budget`` bytes: least recently used first, and
    never one in ``in_use`` (then the cache may stay over its budget)."""
    entries = list(cached)
    total = sum(e.size for e in entries)
    doomed = []
    for entry in sorted(entries, key=lambda e: (e.last_used, e.sha256)):
        if total <= budget:
            break
        if entry.sha256 in in_use:
            continue
        doomed.append(entry.sha256)
        total -= entry.size
    return doomed


def budget_from_env() -> int:
    raw = os.environ.get("EMBER_NODE_BUNDLE_CACHE_BYTES", "").strip()
    try:
        return int(raw) if raw else DEFAULT_BUDGET_BYTES
    except ValueError:
        raise ValueError(f"EMBER_NODE_BUNDLE_CACHE_BYTES={raw!r} is not a whole number of bytes") from None


class BundleCache:
    def __init__(self, root: Path, store: Any, budget_bytes: int | None = None) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._store = store
        self._locks: dict[str, asyncio.Lock] = {}
        self.budget_bytes = budget_from_env() if budget_bytes is None else budget_bytes
        self._sizes: dict[str, int] = {}  # measured once: an unpacked bundle never changes
        self._used: dict[str, float] = {}  # last use in this process (before: the folder's mtime)
        self._fetched = False  # since the last eviction
        self._last_evict = 0.0
        for leftover in self.root.glob(".*"):  # an unpack or a removal that a crash interrupted
            remove_tree(leftover)

    def cached(self) -> list[str]:
        """The bundles unpacked here (placement prefers nodes that hold a function's bundle)."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def has(self, sha256: str) -> bool:
        return (self.root / sha256).is_dir()

    def allow(self, sha256: str, grant: str) -> None:
        """Fetch bundle ``sha256`` with a build request's ``grant`` (``fetch.NodeFetcher.allow``)."""
        if hasattr(self._store, "allow"):
            self._store.allow(sha256, grant)

    async def get(self, sha256: str) -> Path:
        """The unpacked folder of bundle ``sha256``, fetching and verifying it on first use."""
        dest = self.root / sha256
        if dest.is_dir():
            self._touch(sha256)
            return dest
        async with self._locks.setdefault(sha256, asyncio.Lock()):
            if dest.is_dir():
                self._touch(sha256)
                return dest
            data = await self._store.bundle(sha256)  # ``fetch.NodeFetcher``
            digest = hashlib.sha256(data).hexdigest()
            if digest != sha256:
                raise ValueError(f"bundle {sha256} failed verification: its content hashes to {digest}")
            await asyncio.to_thread(self._unpack, data, dest)
            self._fetched = True
            self._touch(sha256)
        return dest

    async def verify(self, sha256: str) -> Path:
        """The unpacked folder of bundle ``sha256``, as it was unpacked: when anything in it changed (or its
        record is missing), it is removed and unpacked again from the store."""
        dest = self.root / sha256
        if dest.is_dir():
            recorded = self._record(sha256)
            kept = await asyncio.to_thread(tree_matches, dest, recorded)
            if kept is not None:
                if kept != recorded:  # an older agent's record, made again without change times
                    (self.root / f"{sha256}.tree").write_text(kept)
                self._touch(sha256)
                return dest
            log.warning("bundle %s changed since it was unpacked on this node: unpacking it again", sha256[:12])
            trash = self.root / f".changed-{sha256[:12]}-{time.monotonic_ns()}"
            with contextlib.suppress(OSError):
                dest.rename(trash)
            self._sizes.pop(sha256, None)
            await asyncio.to_thread(remove_tree, trash)
        return await self.get(sha256)

    def _record(self, sha256: str) -> str:
        try:
            return (self.root / f"{sha256}.tree").read_text()
        except OSError:
            return ""

    def _touch(self, sha256: str) -> None:
        """Mark a use; the folder's mtime keeps it across restarts of the agent (written at most once a minute)."""
        now = time.time()
        if now - self._used.get(sha256, 0.0) >= 60.0:
            with contextlib.suppress(OSError):
                os.utime(self.root / sha256)
        self._used[sha256] = now

    def entries(self) -> list[CachedBundle]:
        """What the cache holds: each bundle's unpacked size and last use."""
        found = []
        for sha256 in self.cached():
            path = self.root / sha256
            if sha256 not in self._sizes:
                self._sizes[sha256] = folder_size(path)
            last_used = self._used.get(sha256)
            if last_used is None:
                try:
                    last_used = path.stat().st_mtime
                except OSError:
                    continue
            found.append(CachedBundle(sha256=sha256, size=self._sizes[sha256], last_used=last_used))
        return found

    async def maybe_evict(self, in_use: Collection[str]) -> list[str]:
        """``evict`` after a fetch, and otherwise at most every ``EVICT_EVERY_S``."""
        now = time.monotonic()
        if not self._fetched and now - self._last_evict < EVICT_EVERY_S:
            return []
        self._fetched, self._last_evict = False, now
        return await self.evict(in_use)

    async def evict(self, in_use: Collection[str]) -> list[str]:
        """Remove least recently used bundles that are not ``in_use`` (nor being fetched) until the cache is
        within its budget; returns the ones removed."""
        entries = await asyncio.to_thread(self.entries)
        busy = set(in_use) | {sha for sha, lock in self._locks.items() if lock.locked()}
        doomed = choose_evictions(entries, busy, self.budget_bytes)
        for sha256 in doomed:
            trash = self.root / f".evicted-{sha256[:12]}-{time.monotonic_ns()}"
            try:
                (self.root / sha256).rename(trash)  # gone at once for ``has`` and ``get``; removed after
            except OSError:
                continue
            self._sizes.pop(sha256, None)
            self._used.pop(sha256, None)
            (self.root / f"{sha256}.tree").unlink(missing_ok=True)
            await asyncio.to_thread(remove_tree, trash)
        if doomed:
            total = sum(e.size for e in entries if e.sha256 not in doomed)
            log.info("bundle cache: removed %d unused bundle(s) (%s); %d of %d bytes held", len(doomed),
                     ", ".join(s[:12] for s in doomed), total, self.budget_bytes)
        return doomed

    def _unpack(self, data: bytes, dest: Path) -> None:
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name[:12]}-", dir=self.root))
        try:
            unpack_bundle(data, tmp)
            make_read_only(tmp)
            tmp.rename(dest)
            (self.root / f"{dest.name}.tree").write_text(tree_digest(dest))
        except BaseException:
            remove_tree(tmp)
            raise
        read_ahead(dest)


def make_read_only(folder: Path) -> None:
    """No write permission on anything in ``folder`` (nor on itself): what runs from it cannot change it."""
    for dirpath, dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, os.lstat(path).st_mode & 0o555)
        for name in dirs:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, 0o555)
    os.chmod(folder, 0o555)


def remove_tree(folder: Path) -> None:
    """Remove ``folder`` though it was made read-only (its folders get write permission back first)."""
    if not folder.exists():
        return
    with contextlib.suppress(OSError):
        os.chmod(folder, 0o755)
    for dirpath, dirs, _ in os.walk(folder):
        for name in dirs:
            with contextlib.suppress(OSError):
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    os.chmod(path, 0o755)
    shutil.rmtree(folder, ignore_errors=True)


TREE_FORMAT = "2:"  # a record without change times, as recorded since (an older agent's has them, and no prefix)


def tree_digest(folder: Path, *, change_times: bool = False) -> str:
    """What ``folder`` holds, in a few bytes: each entry's path, type, mode, size and modification time (a write, a
    chmod, a rename or a new file changes it; reading does not). Not the folder's own times: the agent marks a
    bundle's last use on it. Not the change times, which an older agent recorded (``change_times``): a warm start's
    replica gets its bundle as hard links of the cached one, and each link changed the change time of its file, so
    that the next check of that bundle found it "changed" and unpacked it again, taking it away from under the
    replicas that had it as ``/bundle``."""
    digest = hashlib.sha256()
    for dirpath, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files + dirs):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            target = os.readlink(path) if os.path.islink(path) else ""
            changed = f"{st.st_ctime_ns}\0" if change_times else ""
            digest.update(f"{os.path.relpath(path, folder)}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0"
                          f"{changed}{target}\n".encode())
    return digest.hexdigest() if change_times else TREE_FORMAT + digest.hexdigest()


def tree_matches(folder: Path, recorded: str) -> str | None:
    """Whether ``folder`` holds what ``recorded`` says (an older agent's record is read as it was made): None if
    not, else the record to keep (the same, or an older one made again as it is recorded now)."""
    if not recorded:
        return None
    if recorded.startswith(TREE_FORMAT):
        return recorded if tree_digest(folder) == recorded else None
    return tree_digest(folder) if tree_digest(folder, change_times=True) == recorded else None


def folder_size(folder: Path) -> int:
    """Bytes of the files under ``folder`` (links not followed)."""
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def read_ahead(folder: Path) -> int:
    """Ask the kernel to bring the folder's weight files into the page cache; returns how many it asked for."""
    count = 0
    for path in folder.rglob("*"):
        if path.suffix in WEIGHT_SUFFIXES and path.is_file():
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                    count += 1
            finally:
                os.close(fd)
    return count
