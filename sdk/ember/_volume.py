"""``ember.Volume`` and the client side of volumes: putting a folder's files as a new version (streamed from disk
in chunks, each sent only if the platform lacks it, so that an interrupted put resumes), listing and removing.

A put never holds more than ``workers + 1`` chunks in memory, whatever the files' sizes.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ember._client import Transport, default_transport
from ember._errors import InvalidSpecError
from ember.wire import encoder
from ember.wire.volumes import (
    DEFAULT_CHUNK_BYTES,
    MAX_VOLUME_FILES,
    ChunksMissing,
    VolumeFile,
    VolumeMount,
    VolumeView,
    file_problem,
    mount_problem,
    name_problem,
)

VOLUMES_ENV = "EMBER_VOLUMES"  # in a replica: {mount path: where it is readable}, JSON
CHUNKS_PATH = "/v1/volumes/-/chunks"  # '-' starts no volume's name
_view_decoder = msgspec.json.Decoder(VolumeView)
_views_decoder = msgspec.json.Decoder(list[VolumeView])
_missing_decoder = msgspec.json.Decoder(ChunksMissing)


class Volume:
    """A named, versioned set of files that functions mount read-only: ``ember volume put NAME PATH...`` makes a
    new version; a push pins the latest one (or ``version``) for the functions that mount it.

    Example:
        >>> @app.model(volumes={"/weights": ember.Volume("digits-weights")})
        ... class Classifier:
        ...     @ember.setup
        ...     def load(self):
        ...         self.w = open(ember.mounted("/weights") + "/model.pt", "rb").read()
    """

    def __init__(self, name: str, *, version: int | None = None) -> None:
        problem = name_problem(name)
        if problem:
            raise InvalidSpecError(f"Volume({name!r}): {problem}")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
            raise InvalidSpecError(f"Volume({name!r}, version={version!r}): a version number from 1, or None for "
                                   "the latest at push")
        self.name = name
        self.version = version

    def __repr__(self) -> str:
        return f"ember.Volume({self.name!r}{'' if self.version is None else f', version={self.version}'})"

    def mount(self, path: str) -> VolumeMount:
        return VolumeMount(path=path, name=self.name, version=self.version or 0)


def mounts(where: str, volumes: object) -> dict[str, list[VolumeMount]]:
    """``volumes=`` of a decorator: ``{"/path": ember.Volume(...)}``, checked; as a service spec's field."""
    if volumes is None:
        return {}
    if not isinstance(volumes, dict) or not all(isinstance(v, Volume) for v in volumes.values()):
        raise InvalidSpecError(f"{where}(volumes={volumes!r}): a dict of mount path to ember.Volume, e.g. "
                               "volumes={'/weights': ember.Volume('digits-weights')}")
    found: list[VolumeMount] = []
    for path, volume in sorted(volumes.items(), key=lambda kv: str(kv[0])):
        problem = mount_problem(path) if isinstance(path, str) else f"mount path {path!r} is not a string"
        if problem:
            raise InvalidSpecError(f"{where}(volumes=...): {problem}")
        for other in found:
            if path.startswith(other.path + "/"):
                raise InvalidSpecError(f"{where}(volumes=...): {path!r} is inside {other.path!r}; mount each "
                                       "volume at its own path")
        found.append(volume.mount(path))
    return {"volumes": found}


def mounted(path: str) -> str:
    """Where this replica reads the volume mounted at ``path``: ``path`` itself in a sandbox; on a node that runs
    replicas without one (no mount namespace to put it there), the node's read-only cache folder."""
    table = json.loads(os.environ.get(VOLUMES_ENV, "") or "{}")
    return str(table.get(path, path))


# --- putting a version ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalFile:
    path: str  # inside the volume
    source: Path
    size: int
    executable: bool


@dataclass
class PutProgress:
    """What a put did so far: bytes read and hashed, of them those already stored (not sent again)."""

    total_bytes: int
    done_bytes: int = 0
    skipped_bytes: int = 0
    sent_chunks: int = 0
    skipped_chunks: int = 0


def local_files(paths: Iterable[str | Path]) -> list[LocalFile]:
    """The files a put takes: a file under its own name, a folder's files under their paths inside it (links
    followed only to files inside it). ``InvalidSpecError`` for a path that a volume cannot hold, or twice."""
    found: dict[str, LocalFile] = {}

    def add(inner: str, source: Path) -> None:
        problem = file_problem(inner)
        if problem:
            raise InvalidSpecError(problem)
        if inner in found:
            raise InvalidSpecError(f"two files would be {inner!r} in the volume ({found[inner].source}, {source})")
        st = source.stat()
        found[inner] = LocalFile(inner, source, st.st_size, bool(st.st_mode & 0o111))

    for raw in paths:
        root = Path(raw)
        if root.is_file():
            add(root.name, root)
        elif root.is_dir():
            for dirpath, dirs, files in os.walk(root):
                dirs.sort()
                for name in sorted(files):
                    source = Path(dirpath) / name
                    if source.is_file() and source.resolve().is_relative_to(root.resolve()):
                        add(source.relative_to(root).as_posix(), source)
        else:
            raise InvalidSpecError(f"{raw}: no such file or folder")
    if not found:
        raise InvalidSpecError("nothing to put: give files or folders that hold files")
    if len(found) > MAX_VOLUME_FILES:
        raise InvalidSpecError(f"a volume holds at most {MAX_VOLUME_FILES} files, not {len(found)}")
    for inner in found:  # a file may not also be a folder
        parts = inner.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in found:
                raise InvalidSpecError(f"{'/'.join(parts[:i])!r} is both a file and a folder in the volume")
    return sorted(found.values(), key=lambda f: f.path)


def chunks_of(source: Path, chunk_bytes: int) -> Iterator[tuple[str, bytes]]:
    """Each chunk of a file with its sha256, read one at a time."""
    with source.open("rb") as fh:
        while data := fh.read(chunk_bytes):
            yield hashlib.sha256(data).hexdigest(), data


def put_volume(name: str, paths: Iterable[str | Path], *, transport: Transport | None = None,
               progress: Callable[[PutProgress], None] | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
               workers: int = 4) -> VolumeView:
    """Upload ``paths`` as a new version of volume ``name``: each chunk the platform lacks is sent (a put
    interrupted before its end sends, when run again, only what is still missing), then the version is
    committed. Returns the volume as it is now."""
    problem = name_problem(name)
    if problem:
        raise InvalidSpecError(problem)
    t = transport or default_transport()
    files = local_files(paths)
    state = PutProgress(total_bytes=sum(f.size for f in files))
    lock = threading.Lock()
    committed: list[VolumeFile] = []

    def send(sha: str, data: bytes) -> None:
        missing = _missing_decoder.decode(_post(t, f"{CHUNKS_PATH}/missing", {"chunks": [sha]})).missing
        if missing:
            t.request("PUT", f"{CHUNKS_PATH}/{sha}", content=data, params={"volume": name},
                      headers={"content-type": "application/octet-stream"})
        with lock:
            state.done_bytes += len(data)
            if missing:
                state.sent_chunks += 1
            else:
                state.skipped_chunks += 1
                state.skipped_bytes += len(data)
            if progress is not None:
                progress(state)

    if progress is not None:
        progress(state)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ember-volume-put") as pool:
        pending: set[Future[None]] = set()
        for f in files:
            hashes = []
            for sha, data in chunks_of(f.source, chunk_bytes):
                hashes.append(sha)
                while len(pending) >= workers:  # at most ``workers`` chunks in flight, one more being read
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for d in done:
                        d.result()
                pending.add(pool.submit(send, sha, data))
            committed.append(VolumeFile(path=f.path, size=f.size, chunks=hashes, executable=f.executable))
        for d in pending:
            d.result()
    return _view_decoder.decode(_post(t, f"/v1/volumes/{name}/versions", {"files": committed}))


def list_volumes(*, transport: Transport | None = None) -> list[VolumeView]:
    """The volumes the token sees, each with its latest version."""
    return _views_decoder.decode((transport or default_transport()).request("GET", "/v1/volumes").content)


def get_volume(name: str, *, transport: Transport | None = None) -> VolumeView:
    """One volume: its latest version's files, the versions kept, the apps that mount it."""
    return _view_decoder.decode((transport or default_transport()).request("GET", f"/v1/volumes/{name}").content)


def remove_volume(name: str, *, transport: Transport | None = None) -> None:
    """Remove a volume and every version of it; chunks no other version uses are deleted."""
    (transport or default_transport()).request("DELETE", f"/v1/volumes/{name}")


def _post(t: Transport, path: str, body: object) -> bytes:
    return t.request("POST", path, content=encoder.encode(body), headers={"content-type": "application/json"}).content
