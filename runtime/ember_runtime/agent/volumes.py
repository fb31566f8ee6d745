"""The node's volume cache: each volume version a replica or zygote mounts is fetched once through a control
plane (``agent.fetch``: only the versions and chunks assigned to this node), every chunk checked against its
sha256, into ``<state>/volumes/<name>@v<N>/``, made read-only, and mounted read-only in the sandboxes that use it
(``--ro-bind``; see ``sandbox.Jail.mounts``).

Only the agent writes here. What each cached version holds is recorded when it is fetched: its manifest with each
chunk's size (``<key>.json``) and every file's path, mode, size and change time (``<key>.tree``). Before each
replica start and zygote build, ``ensure`` compares the folder with that record (a few ``stat`` calls); when it
differs, or when the version was not checked since this agent started, every chunk is hashed again and those that
fail are fetched again and written in place. A version no replica, zygote or assignment of the node uses is
removed, least recently used first, when the cache is over ``EMBER_NODE_VOLUME_CACHE_BYTES`` (100 GiB).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import msgspec
import nats.aio.client as nats_client

from ember.wire.volumes import VolumeMount, VolumeVersion, file_problem
from ember_runtime.agent.bundles import (
    CachedBundle,
    choose_evictions,
    make_read_only,
    remove_tree,
    tree_digest,
    tree_matches,
)

log = logging.getLogger("ember.agent.volumes")
DEFAULT_BUDGET_BYTES = 100 * 1024**3
FREE_DISK_KEPT_BYTES = 1024**3  # a version is fetched only where this much disk stays free after it
AHEAD = 4  # chunks fetched ahead of the one being written (memory: AHEAD + 1 chunks)
_version_decoder = msgspec.json.Decoder(VolumeVersion)


class LocalChunk(msgspec.Struct, frozen=True, array_like=True):
    sha256: str
    size: int


class LocalFile(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    size: int
    chunks: list[LocalChunk]


class LocalVersion(msgspec.Struct, frozen=True, kw_only=True):
    """What a cached version holds, with each chunk's size (to check it again chunk by chunk)."""

    name: str
    version: int
    files: list[LocalFile]


_local_decoder = msgspec.json.Decoder(LocalVersion)


class VolumeCorrupt(RuntimeError):
    """A version in the store whose files or chunks are not what its manifest says."""


class VolumeTooLarge(RuntimeError):
    """A version bigger than this node's volume cache may hold, or than its free disk: never fetched."""


def budget_from_env() -> int:
    raw = os.environ.get("EMBER_NODE_VOLUME_CACHE_BYTES", "").strip()
    try:
        return int(raw) if raw else DEFAULT_BUDGET_BYTES
    except ValueError:
        raise ValueError(f"EMBER_NODE_VOLUME_CACHE_BYTES={raw!r} is not a whole number of bytes") from None


class VolumeCache:
    def __init__(self, root: Path, source: Any, budget_bytes: int | None = None) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        self._source = source  # ``fetch.NodeFetcher``: versions and chunks, through a control plane
        self.budget_bytes = budget_from_env() if budget_bytes is None else budget_bytes
        self._locks: dict[str, asyncio.Lock] = {}
        self._checked: set[str] = set()  # hashed (or fetched) by this process, its record matching since
        self._used: dict[str, float] = {}
        self._sizes: dict[str, int] = {}
        self.refetched_chunks = 0  # chunks found corrupt and fetched again (tests and logs read it)
        for leftover in self.root.glob(".*"):
            remove_tree(leftover)

    def cached(self) -> list[str]:
        """The versions held here, as ``name@vN`` (placement prefers nodes that hold a function's volumes)."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def has(self, mount: VolumeMount) -> bool:
        return (self.root / mount.key).is_dir()

    def path(self, mount: VolumeMount) -> Path:
        return self.root / mount.key

    async def ensure(self, mount: VolumeMount) -> Path:
        """The folder of ``mount``'s version, fetched on first use and checked (see the module's docstring)."""
        key = mount.key
        async with self._locks.setdefault(key, asyncio.Lock()):
            dest = self.root / key
            if not dest.is_dir():
                await self._fetch(mount, dest)
            elif key not in self._checked or not await self._still(key, dest):
                await self._repair(key, dest)
            self._touch(key)
        return dest

    # --- fetching -----------------------------------------------------------------------------------------------

    async def _fetch(self, mount: VolumeMount, dest: Path) -> None:
        started = time.monotonic()
        version = _version_decoder.decode(await self._source.volume(f"{mount.name}.{mount.version}"))
        if version.name != mount.name or version.version != mount.version:
            raise VolumeCorrupt(f"{mount.key}: the store's entry names {version.name}@v{version.version}")
        room = min(self.budget_bytes, shutil.disk_usage(self.root).free - FREE_DISK_KEPT_BYTES)
        if version.size > room:  # a few chunks named over and over make a version of any size: not on this disk
            raise VolumeTooLarge(f"{mount.key} holds {version.size} bytes, more than this node keeps for volumes "
                                 f"({max(room, 0)} bytes: its cache's budget, EMBER_NODE_VOLUME_CACHE_BYTES, within "
                                 "its free disk)")
        tmp = Path(tempfile.mkdtemp(prefix=f".{mount.key}-", dir=self.root))
        try:
            files = []
            for f in version.files:
                problem = file_problem(f.path)
                if problem:  # the platform checks this too; a node trusts no path it writes to
                    raise VolumeCorrupt(f"{mount.key}: {problem}")
                target = tmp / f.path
                target.parent.mkdir(parents=True, exist_ok=True)
                sizes = await self._write_file(target, f.chunks)
                if sum(sizes) != f.size:
                    raise VolumeCorrupt(f"{mount.key}: {f.path} holds {sum(sizes)} bytes, not {f.size}")
                os.chmod(target, 0o555 if f.executable else 0o444)
                files.append(LocalFile(path=f.path, size=f.size,
                                       chunks=[LocalChunk(s, n) for s, n in zip(f.chunks, sizes, strict=True)]))
            make_read_only(tmp)
            tmp.rename(dest)
        except BaseException:
            remove_tree(tmp)
            raise
        local = LocalVersion(name=mount.name, version=mount.version, files=files)
        (self.root / f"{mount.key}.json").write_bytes(msgspec.json.encode(local))
        (self.root / f"{mount.key}.tree").write_text(await asyncio.to_thread(tree_digest, dest))
        self._checked.add(mount.key)
        elapsed = time.monotonic() - started
        log.info("volume %s: fetched %d files, %d bytes in %.1fs (%.0f MB/s)", mount.key, len(files), version.size,
                 elapsed, version.size / 1e6 / max(elapsed, 1e-6))

    async def _write_file(self, target: Path, chunks: list[str]) -> list[int]:
        """Fetch ``chunks`` (``AHEAD`` at a time, each checked) and write them in order to ``target``."""
        sizes: list[int] = []
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        writing: asyncio.Future[None] | None = None  # the thread writing to fd: it must end before fd is closed
        try:
            pending: list[asyncio.Task[bytes]] = []
            upcoming = iter(chunks)
            for sha in upcoming:
                pending.append(asyncio.create_task(self._chunk(sha)))
                if len(pending) > AHEAD:
                    break
            while pending:
                data = await pending.pop(0)
                nxt = next(upcoming, None)
                if nxt is not None:
                    pending.append(asyncio.create_task(self._chunk(nxt)))
                writing = asyncio.ensure_future(asyncio.to_thread(_write_all, fd, data))
                await asyncio.shield(writing)  # a cancel here leaves the thread writing: awaited below
                sizes.append(len(data))
        except BaseException:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            raise
        finally:
            if writing is not None and not writing.done():  # closed under the thread, fd could be another file's
                await asyncio.gather(writing, return_exceptions=True)
            os.close(fd)
        return sizes

    async def _chunk(self, sha: str) -> bytes:
        """One chunk, read through a control plane (only a chunk of a version assigned to this node), checked
        against its sha256."""
        data = await self._source.chunk(sha)  # ``fetch.NodeFetcher``
        digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
        if digest != sha:
            raise VolumeCorrupt(f"chunk {sha} from the store hashes to {digest}")
        return data

    # --- checking -----------------------------------------------------------------------------------------------

    async def _still(self, key: str, dest: Path) -> bool:
        """Whether the version's folder holds what was recorded (an older agent's record is made again as now)."""
        recorded = self._record(key)
        kept = await asyncio.to_thread(tree_matches, dest, recorded)
        if kept is not None and kept != recorded:
            (self.root / f"{key}.tree").write_text(kept)
        return kept is not None

    def _record(self, key: str) -> str:
        try:
            return (self.root / f"{key}.tree").read_text()
        except OSError:
            return ""

    async def _repair(self, key: str, dest: Path) -> None:
        """Hash every chunk of the version again; fetch those that fail and write them in place. A version
        without its record, or whose files are not where they were, is removed and fetched again whole."""
        try:
            local = _local_decoder.decode((self.root / f"{key}.json").read_bytes())
            bad = await asyncio.to_thread(bad_chunks, dest, local)
        except (OSError, msgspec.MsgspecError) as exc:
            log.warning("volume %s: cannot be checked (%s): fetching it again", key, exc)
            name, _, version = key.rpartition("@v")
            await self._remove(key)
            await self._fetch(VolumeMount(path="/", name=name, version=int(version)), dest)
            return
        for path, offset, chunk in bad:
            log.warning("volume %s: chunk %s of %s fails its hash check: fetching it again", key, chunk.sha256[:12],
                        path)
            data = await self._chunk(chunk.sha256)
            await asyncio.to_thread(_rewrite, dest / path, offset, data)
            self.refetched_chunks += 1
        (self.root / f"{key}.tree").write_text(await asyncio.to_thread(tree_digest, dest))
        self._checked.add(key)

    # --- collecting -----------------------------------------------------------------------------------------------

    def _touch(self, key: str) -> None:
        now = time.time()
        if now - self._used.get(key, 0.0) >= 60.0:
            with contextlib.suppress(OSError):
                os.utime(self.root / f"{key}.json")
        self._used[key] = now

    def entries(self) -> list[CachedBundle]:
        found = []
        for key in self.cached():
            if key not in self._sizes:
                try:
                    local = _local_decoder.decode((self.root / f"{key}.json").read_bytes())
                    self._sizes[key] = sum(f.size for f in local.files)
                except (OSError, msgspec.MsgspecError):
                    self._sizes[key] = 0
            last = self._used.get(key)
            if last is None:
                with contextlib.suppress(OSError):
                    last = (self.root / f"{key}.json").stat().st_mtime
            found.append(CachedBundle(sha256=key, size=self._sizes[key], last_used=last or 0.0))
        return found

    async def evict(self, in_use: Collection[str]) -> list[str]:
        """Remove the least recently used versions that nothing uses until the cache is within its budget."""
        entries = await asyncio.to_thread(self.entries)
        busy = set(in_use) | {k for k, lock in self._locks.items() if lock.locked()}
        doomed = choose_evictions(entries, busy, self.budget_bytes)
        for key in doomed:
            await self._remove(key)
        if doomed:
            log.info("volume cache: removed %s (budget %d bytes)", ", ".join(doomed), self.budget_bytes)
        return doomed

    async def _remove(self, key: str) -> None:
        trash = self.root / f".removed-{key}-{time.monotonic_ns()}"
        with contextlib.suppress(OSError):
            (self.root / key).rename(trash)
        for suffix in (".json", ".tree"):
            (self.root / f"{key}{suffix}").unlink(missing_ok=True)
        self._checked.discard(key)
        self._sizes.pop(key, None)
        self._used.pop(key, None)
        await asyncio.to_thread(remove_tree, trash)


NATS_READ_BYTES = 1024 * 1024


def widen_nats_reads() -> None:
    """Let this process's NATS connections read their socket up to 1 MiB at a time, not nats-py's 32 KiB: a
    volume's chunks arrive in messages of megabytes, and each read costs a parse and a copy (fetching ran about a
    third faster, interleaved; see bench/RESULTS.md). nats-py reads ``DEFAULT_BUFFER_SIZE`` at each turn of its
    read loop; a read returns what has arrived, so small messages are unaffected."""
    nats_client.DEFAULT_BUFFER_SIZE = max(nats_client.DEFAULT_BUFFER_SIZE, NATS_READ_BYTES)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def bad_chunks(folder: Path, local: LocalVersion) -> list[tuple[str, int, LocalChunk]]:
    """Every chunk of ``local`` whose bytes in ``folder`` do not hash to its sha256: (file, offset, chunk)."""
    bad = []
    for f in local.files:
        path = folder / f.path
        if path.is_symlink() or not path.is_file():
            raise OSError(f"{f.path} is not a plain file any more")
        with path.open("rb") as fh:
            offset = 0
            for chunk in f.chunks:
                data = fh.read(chunk.size)
                if len(data) != chunk.size or hashlib.sha256(data).hexdigest() != chunk.sha256:
                    bad.append((f.path, offset, chunk))
                offset += chunk.size
            if fh.read(1):
                raise OSError(f"{f.path} is longer than it was")
    return bad


def _rewrite(path: Path, offset: int, data: bytes) -> None:
    mode = path.stat().st_mode & 0o777
    os.chmod(path, 0o600)
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, offset)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        os.chmod(path, mode)
