"""Volumes: named, versioned sets of files that functions mount read-only (``volumes={"/weights": ember.Volume(
"digits-weights")}``), stored content-addressed in chunks.

A file of a volume is a list of chunks, each stored once in the ``ember_volume_chunks`` object store under its
sha256 (the same bytes in two files, two versions or two volumes are stored once). A version is a manifest, the
files with their chunks, kept in the ``ember_volumes`` bucket under ``<name>.<version>``. A push pins each mount
to a version (the latest, unless the decorator names one), so a new ``ember volume put`` reaches a function at its
next push, never under a running replica.

These are pure checks and the bodies of ``/v1/volumes``: names, mount paths, file paths inside a volume.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated

import msgspec
from msgspec import Meta

from ember.wire.bounds import Sha256

VOLUME_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
CHUNK_SHA = re.compile(r"[0-9a-f]{64}")
MOUNT_PATH = re.compile(r"/[A-Za-z0-9._/-]{1,254}")
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024  # what the client cuts files into
MAX_CHUNK_BYTES = 8 * 1024 * 1024  # what the platform takes in one PUT (EMBER_MAX_VOLUME_CHUNK_BYTES may lower it)
MAX_VOLUMES_PER_SERVICE = 8
MAX_VOLUME_FILES = 100_000
MAX_FILE_PATH = 1024
MAX_PATH_DEPTH = 32
MAX_CHUNKS_QUERY = 10_000  # hashes in one "which are missing" question
# Where no volume may be mounted, nor above (``/`` holds them all, ``/home`` holds the sandbox's home): the
# system, the sandbox's own folders and the bundle. The node agent adds its Python environment's folders.
RESERVED_MOUNTS = ("/proc", "/sys", "/dev", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                   "/boot", "/run", "/var", "/tmp", "/root", "/home/ember", "/bundle")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a volume, or None."""
    if isinstance(name, str) and VOLUME_NAME.fullmatch(name):
        return None
    shown = name if len(str(name)) <= 80 else str(name)[:80] + "..."
    return f"volume name {shown!r}: 1 to 63 lowercase letters, digits and '-', starting with a letter or digit"


def mount_problem(path: str, reserved: tuple[str, ...] = RESERVED_MOUNTS) -> str | None:
    """Why a volume cannot be mounted at ``path``, or None: it must be absolute and normalised (no ``..``, no
    ``//``, no trailing ``/``), of ``[A-Za-z0-9._/-]``, and neither over nor under a reserved folder."""
    shown = path if len(str(path)) <= 80 else str(path)[:80] + "..."
    if not isinstance(path, str) or not MOUNT_PATH.fullmatch(path) or posixpath.normpath(path) != path \
            or any(part in (".", "..") for part in path.split("/")):
        return (f"mount path {shown!r}: an absolute, normalised path of letters, digits, '.', '_', '-' and '/' "
                "(no '..', no '//', no trailing '/'), e.g. '/weights'")
    for root in reserved:
        if path == root or path.startswith(root + "/") or root.startswith(path + "/"):
            return f"mount path {shown!r} is over or under {root}, which the sandbox keeps for itself"
    return None


def file_problem(path: str) -> str | None:
    """Why ``path`` cannot name a file inside a volume, or None: relative, normalised, no ``..`` nor ``.``."""
    shown = path if len(str(path)) <= 80 else str(path)[:80] + "..."
    if not isinstance(path, str) or not path or len(path) > MAX_FILE_PATH or not path.isprintable() \
            or "\\" in path:
        return f"file path {shown!r}: 1 to {MAX_FILE_PATH} printable characters, no backslash"
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or len(parts) > MAX_PATH_DEPTH:
        return (f"file path {shown!r}: relative and normalised inside the volume (no leading '/', no '.' or '..', "
                f"no '//'), at most {MAX_PATH_DEPTH} levels")
    return None


class VolumeMount(msgspec.Struct, frozen=True, kw_only=True):
    """A volume a service mounts: at ``path``, read-only. ``version`` 0 (in a push) is the latest one; the
    platform pins it when it records the deployment."""

    path: str
    name: str
    version: int = 0

    @property
    def key(self) -> str:
        """``name@vN``: what a node reports holding (``NodeInfo.volumes``)."""
        return f"{self.name}@v{self.version}"


class VolumeFile(msgspec.Struct, frozen=True, kw_only=True):
    """One file of a version: its path inside the volume, size, mode bits (0o755 or 0o644) and its chunks'
    sha256s, in order."""

    path: str
    size: int
    chunks: list[str]
    executable: bool = False


class VolumeCommit(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/volumes/<name>/versions``: a new version made of chunks already uploaded."""

    files: list[VolumeFile]


class VolumeVersion(msgspec.Struct, frozen=True, kw_only=True):
    """A version, as kept in the ``ember_volumes`` bucket under ``<name>.<version>``."""

    name: str
    version: int
    files: list[VolumeFile]
    size: int
    created_at: float


class ChunksQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/volumes/chunks/missing``: which of these chunks the platform does not hold (to upload them)."""

    chunks: Annotated[list[Sha256], Meta(max_length=MAX_CHUNKS_QUERY)]


class ChunksMissing(msgspec.Struct, frozen=True, kw_only=True):
    missing: list[str]


class VolumeFileView(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    size: int


class VolumeView(msgspec.Struct, frozen=True, kw_only=True):
    """A volume as ``GET /v1/volumes`` lists it (its latest version), and ``GET /v1/volumes/<name>`` shows it
    (with its files and every version kept)."""

    name: str
    version: int
    size: int
    file_count: int
    created_at: float
    versions: list[int] = []
    files: list[VolumeFileView] = []
    used_by: list[str] = []  # apps whose current version mounts it
