"""The volume store: versions in the ``ember_volumes`` bucket (``<name>.<version>``, mirrored in memory by every
control plane), chunks in the ``ember_volume_chunks`` object store under their sha256.

Version numbers only grow: ``<name>.last`` keeps the last one given, and outlives a removal, so that a number
never means two contents (a deployment pinned to ``weights@v3`` cannot get other files after a remove and a put).
Removing a volume deletes the chunks that no other version uses; every ``EMBER_VOLUME_GC_INTERVAL_S`` (300), and at
each removal, the chunks that no version uses and that were uploaded more than ``grace_s`` ago (an abandoned put's)
go too; a put in progress (uploaded recently, not yet committed) is spared.

A chunk is stored once, whoever uploads it, and recorded for the app patterns of every token that did
(``control.owners``): a version of volume V may name only chunks recorded for a pattern that matches V (an admin's
upload, ``'*'``, matches every name; an admin's commit may name any stored chunk). Any other chunk is answered as
one never uploaded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import msgspec
from nats.js import JetStreamContext, api
from nats.js.errors import KeyWrongLastSequenceError, ObjectNotFoundError
from nats.js.errors import NotFoundError as JsNotFound
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from ember._errors import ConflictError, InvalidInputError, NotFoundError, PayloadTooLargeError
from ember._loop import cancel_and_wait
from ember.wire import Deployment, Manifest, ServiceSpec, encoder, subjects
from ember.wire.jetstream import KVMirror, object_stream
from ember.wire.volumes import VolumeFile, VolumeFileView, VolumeMount, VolumeVersion, VolumeView
from ember_platform.auth.scopes import Principal
from ember_platform.control.bundle_gc import upload_time
from ember_platform.control.owners import Owners, covers
from ember_platform.volumes.checks import check_files, chunks_of, unreferenced

log = logging.getLogger("ember.volumes")
_version_decoder = msgspec.json.Decoder(VolumeVersion)
GC_GRACE_S = 1800.0  # an unreferenced chunk younger than this may belong to a put in progress
GC_INTERVAL_S = float(os.environ.get("EMBER_VOLUME_GC_INTERVAL_S", "300"))
_LOOKUPS = 32  # chunk lookups in flight at once


def _decode(raw: bytes) -> VolumeVersion | int:
    return int(raw) if raw.isdigit() else _version_decoder.decode(raw)


def no_such_volume(name: str) -> NotFoundError:
    """The 404 of a volume that does not exist, word for word that of one the token does not see."""
    return NotFoundError(f"no volume named {name!r} (`ember volume ls` lists them)")


def object_chunk_bytes(max_payload: int) -> int:
    """The object store's own chunk size (one NATS message): big, for fewer acknowledged publishes."""
    return max(64 * 1024, min(4 * 1024 * 1024, max_payload // 2))


class VolumeStore:
    def __init__(self, kv: KeyValue, chunks: ObjectStore, js: JetStreamContext, *, max_value_bytes: int,
                 max_payload: int, grace_s: float = GC_GRACE_S) -> None:
        self._kv = kv
        self._chunks = chunks
        self._js = js
        self._max_value_bytes = max_value_bytes
        self._chunk_meta = api.ObjectMetaOptions(max_chunk_size=object_chunk_bytes(max_payload))
        self.grace_s = grace_s
        self.mirror: KVMirror[VolumeVersion | int] = KVMirror(kv, _decode)
        self._commit = asyncio.Lock()
        self._collector: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.owners: Owners  # set by start()

    async def start(self) -> None:
        self.owners = await Owners.open(self._js)
        await self.mirror.start()
        self._collector = asyncio.create_task(self._collect_every(GC_INTERVAL_S), name="volume-chunks-gc")

    async def stop(self) -> None:
        self._stopping.set()
        if self._collector is not None:
            await cancel_and_wait(self._collector)
        await self.mirror.stop()

    async def _collect_every(self, interval_s: float) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval_s)
            if self._stopping.is_set():
                return
            try:
                await self.collect()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("volume chunks could not be collected; trying again in %.0fs", interval_s)

    # --- chunks -----------------------------------------------------------------------------------------------

    async def put_chunk(self, sha: str, data: bytes, patterns: list[str]) -> bool:
        """Store one chunk (its hash checked: 422 otherwise) for the volumes ``patterns`` match; False when it
        was stored and recorded for them already (a chunk another tenant stored is not written again, and that it
        was is not told)."""
        digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
        if digest != sha:
            raise InvalidInputError(f"the chunk's content hashes to {digest}, not the {sha} in the URL",
                                    field="$body")
        info = await self._info(sha)
        if info is None or self._near_collection(info):  # a copy the collector may take soon is written anew:
            await self._store(sha, data)  # the commit that follows finds it (another tenant's upload too)
            if info is not None and info.nuid:
                with contextlib.suppress(Exception):
                    await self._js.purge_stream(object_stream(subjects.VOLUME_CHUNKS_STORE),
                                                subject=f"$O.{subjects.VOLUME_CHUNKS_STORE}.C.{info.nuid}")
        return await self.owners.add("chunk", sha, patterns) or info is None

    def _near_collection(self, info: api.ObjectInfo) -> bool:
        """Stored half the collector's grace ago or more (it deletes unused chunks past the grace)."""
        return time.time() - upload_time(info.mtime) >= self.grace_s / 2

    async def _store(self, sha: str, data: bytes) -> None:
        """Write ``data`` as the object ``sha``, exactly as the object store's ``put`` would (its messages on
        ``$O.<bucket>.C.<nuid>``, then its info on ``$O.<bucket>.M.<name>``), but its messages published together
        and its digest the sha256 already checked: one hash and one round trip less than ``put``, no lookup."""
        js = self._js
        bucket = subjects.VOLUME_CHUNKS_STORE
        nuid = uuid.uuid4().hex  # the object's messages' subject: unique, so a rewrite never mixes with them
        size = self._chunk_meta.max_chunk_size or len(data)
        parts = [data[i:i + size] for i in range(0, len(data), size)] or [b""]
        chunk_subject = f"$O.{bucket}.C.{nuid}"
        try:
            await asyncio.gather(*(js.publish(chunk_subject, part) for part in parts if part))
            info = api.ObjectInfo(name=sha, bucket=bucket, nuid=nuid, size=len(data),
                                  chunks=sum(1 for p in parts if p), options=self._chunk_meta,
                                  mtime=datetime.now(UTC).isoformat(),
                                  digest="SHA-256=" + base64.urlsafe_b64encode(bytes.fromhex(sha)).decode())
            name = base64.urlsafe_b64encode(sha.encode()).decode()
            await js.publish(f"$O.{bucket}.M.{name}", json.dumps(info.as_dict()).encode(),
                             headers={api.Header.ROLLUP: "sub"})
        except BaseException:
            with contextlib.suppress(Exception):
                await js.purge_stream(object_stream(bucket), subject=chunk_subject)
            raise

    async def _info(self, sha: str) -> api.ObjectInfo | None:
        try:
            info = await self._chunks.get_info(sha)
        except (ObjectNotFoundError, JsNotFound):
            return None
        return None if info.deleted else info

    async def missing(self, shas: list[str], principal: Principal) -> list[str]:
        """Those of ``shas`` not stored, or not recorded for every volume name ``principal`` sees (it uploads its
        own copy, which records its patterns), in their order."""
        infos = await self._infos(shas)
        mine = await self.owners.covering_token("chunk", shas, principal)
        near = [sha for sha, info in infos.items() if info is not None and self._near_collection(info)]
        stale = unreferenced(near, self._kept_files()) if near else set()  # near collection, no version uses it
        return [sha for sha, info in infos.items() if info is None or sha not in mine or sha in stale]

    def _kept_files(self) -> list[list[VolumeFile]]:
        """The files of every kept version (what the collector never deletes a chunk of)."""
        return [v.files for v in self.mirror.items.values() if isinstance(v, VolumeVersion)]

    async def _sizes(self, shas: Iterable[str]) -> dict[str, int | None]:
        return {sha: None if info is None else int(info.size or 0) for sha, info in (await self._infos(shas)).items()}

    async def _infos(self, shas: Iterable[str]) -> dict[str, api.ObjectInfo | None]:
        gate = asyncio.Semaphore(_LOOKUPS)

        async def one(sha: str) -> api.ObjectInfo | None:
            async with gate:
                return await self._info(sha)

        unique = list(dict.fromkeys(shas))
        return dict(zip(unique, await asyncio.gather(*(one(s) for s in unique)), strict=True))

    # --- versions ---------------------------------------------------------------------------------------------

    def versions(self, name: str) -> list[VolumeVersion]:
        """The kept versions of ``name``, oldest first."""
        found = [v for k, v in self.mirror.items.items() if isinstance(v, VolumeVersion) and k.split(".")[0] == name]
        return sorted(found, key=lambda v: v.version)

    def latest(self, name: str) -> VolumeVersion | None:
        found = self.versions(name)
        return found[-1] if found else None

    def names(self) -> list[str]:
        return sorted({v.name for v in self.mirror.items.values() if isinstance(v, VolumeVersion)})

    async def commit(self, name: str, files: list[VolumeFile], max_chunk_bytes: int, *,
                     any_chunk: bool = False) -> VolumeVersion:
        """A new version of ``name`` made of ``files``, whose chunks must all be stored for ``name`` (unless
        ``any_chunk``: an admin's commit) -- 409 naming the first missing, a chunk stored for other names alike --
        and add up to each file's size (422)."""
        check_files(files, max_chunk_bytes)
        sizes = await self._sizes(chunks_of(files))
        if not any_chunk:
            usable = await self.owners.covering("chunk", sizes, name)
            sizes = {sha: size if sha in usable else None for sha, size in sizes.items()}
        for i, f in enumerate(files):
            for j, sha in enumerate(f.chunks):
                if sizes[sha] is None:
                    gone = sum(1 for s in sizes.values() if s is None)
                    raise ConflictError(f"{gone} chunk(s) are not uploaded, {sha} first: put them, then commit "
                                        "(`ember volume put` does both)", field=f"$.files[{i}].chunks[{j}]")
            held = sum(sizes[sha] or 0 for sha in f.chunks)
            if held != f.size:
                raise InvalidInputError(f"the chunks of {f.path!r} hold {held} bytes, not {f.size}",
                                        field=f"$.files[{i}].size")
        async with self._commit:
            number = max([self._last(name), *(v.version for v in self.versions(name))]) + 1
            version = VolumeVersion(name=name, version=number, files=files, size=sum(f.size for f in files),
                                    created_at=time.time())
            raw = encoder.encode(version)
            if len(raw) > self._max_value_bytes:
                raise PayloadTooLargeError(f"this version's manifest is {len(raw)} bytes, over the "
                                           f"{self._max_value_bytes}-byte limit (EMBER_VOLUMES_KV_MAX_VALUE_BYTES): "
                                           "fewer files, or larger chunks", field="$.files")
            while True:
                try:
                    revision = await self._kv.create(f"{name}.{number}", raw)
                    break
                except KeyWrongLastSequenceError:  # another control plane took this number
                    number += 1
                    version = msgspec.structs.replace(version, version=number)
                    raw = encoder.encode(version)
            self.mirror.record(f"{name}.{number}", version, revision)
            self.mirror.record(f"{name}.last", number, await self._kv.put(f"{name}.last", str(number).encode()))
        log.info("volume %s: version %d, %d files, %d bytes", name, number, len(files), version.size)
        return version

    def _last(self, name: str) -> int:
        last = self.mirror.items.get(f"{name}.last")
        return last if isinstance(last, int) else 0

    async def remove(self, name: str, deployments: Iterable[Deployment],
                     sees: Callable[[str], bool] = lambda _: True) -> list[str]:
        """Remove every version of ``name`` (409 while a current deployment mounts it, naming the apps ``sees``
        allows); returns the chunks deleted: its own that no other version uses, and unused ones older than
        ``grace_s``."""
        doomed = self.versions(name)
        if not doomed:
            raise no_such_volume(name)
        users = sorted(d.app for d in deployments if _mounted_by(d, name))
        if users:
            shown = [u for u in users if sees(u)] + (["apps this token does not see"]  # not how many: hidden
                                                     if not all(map(sees, users)) else [])
            raise ConflictError(f"volume {name!r} is mounted by a version of {', '.join(shown)} that has replicas "
                                "(serving, rolling out or kept warm): push them without it (or delete them) first",
                                field="volume")
        for v in doomed:
            await self._kv.purge(f"{v.name}.{v.version}")
            self.mirror.record(f"{v.name}.{v.version}", None, 1 << 62)
        return await self.collect(chunks_of(f for v in doomed for f in v.files), of=name)

    async def collect(self, freed: Iterable[str] = (), of: str | None = None) -> list[str]:
        """Delete the chunks that no kept version uses: those of ``freed`` whatever their age, the others once
        older than ``grace_s``. Freed by removing volume ``of``, a chunk that a token not covering that name also
        uploaded waits for the grace as well: another tenant may be putting the same bytes in a volume of its own
        (deleted at once, its commit found them gone)."""
        freed = set(freed)
        if of is not None:
            freed = {sha for sha in freed if all(covers([p], of) for p in await self.owners.patterns("chunk", sha))}
        now = time.time()
        old = set()
        try:
            for info in await self._chunks.list():
                if info.name and not info.deleted and now - upload_time(info.mtime) >= self.grace_s:
                    old.add(info.name)
        except Exception as exc:  # an empty store answers "not found"
            log.debug("listing volume chunks: %s", exc)
        doomed = sorted(unreferenced(freed | old, self._kept_files()))
        for sha in doomed:
            try:
                await self._chunks.delete(sha)
            except (ObjectNotFoundError, JsNotFound):
                continue
            finally:
                await self.owners.forget("chunk", sha)
        if doomed:
            log.info("volumes: deleted %d chunk(s) no version uses", len(doomed))
        return doomed

    # --- views and deployments --------------------------------------------------------------------------------

    def view(self, name: str, deployments: Iterable[Deployment], *, detail: bool = False,
             sees: Callable[[str], bool] = lambda _: True) -> VolumeView:
        """The volume as a token that ``sees`` some apps is shown it: only those among the apps that mount it."""
        kept = self.versions(name)
        if not kept:
            raise no_such_volume(name)
        last = kept[-1]
        users = sorted(d.app for d in deployments
                       if sees(d.app) and any(m.name == name for m in mounts_of(d.manifest)))
        return VolumeView(name=name, version=last.version, size=last.size, file_count=len(last.files),
                          created_at=last.created_at, versions=[v.version for v in kept],
                          files=[VolumeFileView(path=f.path, size=f.size) for f in last.files] if detail else [],
                          used_by=users)

    def pin(self, manifest: Manifest, sees: Callable[[str], bool]) -> Manifest:
        """``manifest`` with every mount pinned to a version: the latest for 0. A volume that does not exist,
        or that the pushing token does not see, is a 422 naming the field."""
        services: list[ServiceSpec] = []
        for i, svc in enumerate(manifest.services):
            pinned: list[VolumeMount] = []
            for j, mount in enumerate(svc.volumes):
                at = f"$.manifest.services[{i}].volumes[{j}]"
                kept = {v.version for v in self.versions(mount.name)} if sees(mount.name) else set()
                if not kept:
                    raise InvalidInputError(f"volume {mount.name!r} does not exist: put it first (`ember volume put "
                                            f"{mount.name} PATH...`; `ember volume ls` lists them)", field=f"{at}.name")
                if mount.version and mount.version not in kept:
                    raise InvalidInputError(f"volume {mount.name!r} has no version {mount.version} (it keeps "
                                            f"{', '.join(map(str, sorted(kept)))})", field=f"{at}.version")
                pinned.append(msgspec.structs.replace(mount, version=mount.version or max(kept)))
            services.append(msgspec.structs.replace(svc, volumes=pinned))
        return msgspec.structs.replace(manifest, services=services)


def mounts_of(manifest: Manifest) -> list[VolumeMount]:
    return [m for svc in manifest.services for m in svc.volumes]


def _mounted_by(dep: Deployment, name: str) -> bool:
    """Whether a version of ``dep`` that has replicas (the one rolled out, those taking calls, the warm one) mounts
    volume ``name``: the version rolled out alone was looked at, and a volume still mounted by the version serving
    (a rollout, a canary's stable version) lost its chunks under it."""
    for version in (dep.running() | {dep.warm}) - {0}:
        release = dep.release(version)
        if release is not None and any(m.name == name for m in mounts_of(release.manifest)):
            return True
    return False
