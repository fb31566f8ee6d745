"""Pure checks of what a client sends to make a volume's version: chunk addresses, files and their paths."""

from __future__ import annotations

from collections.abc import Iterable

from ember._errors import InvalidInputError
from ember.wire.volumes import CHUNK_SHA, MAX_VOLUME_FILES, VolumeFile, file_problem


def check_sha(sha: str, field: str) -> str:
    """``sha`` if it is a chunk's address (lowercase hex sha256); else 422 naming ``field``."""
    if not isinstance(sha, str) or not CHUNK_SHA.fullmatch(sha):
        shown = sha if len(str(sha)) <= 80 else str(sha)[:80] + "..."
        raise InvalidInputError(f"{shown!r} is not a chunk's address: its lowercase hex sha256", field=field)
    return sha


def check_files(files: list[VolumeFile], max_chunk_bytes: int) -> None:
    """A version's files: 1 to ``MAX_VOLUME_FILES``, each path valid inside a volume and given once, no path both
    a file and a folder, sizes that their chunks can hold; 422 naming the field."""
    if not 1 <= len(files) <= MAX_VOLUME_FILES:
        raise InvalidInputError(f"a version holds 1 to {MAX_VOLUME_FILES} files, not {len(files)}", field="$.files")
    seen: set[str] = set()
    for i, f in enumerate(files):
        at = f"$.files[{i}]"
        problem = file_problem(f.path)
        if problem:
            raise InvalidInputError(problem, field=f"{at}.path")
        if f.path in seen:
            raise InvalidInputError(f"file {f.path!r} is given twice", field=f"{at}.path")
        seen.add(f.path)
        for j, sha in enumerate(f.chunks):
            check_sha(sha, f"{at}.chunks[{j}]")
        if not 0 <= f.size <= len(f.chunks) * max_chunk_bytes or (f.size == 0) != (not f.chunks):
            raise InvalidInputError(f"size {f.size} does not fit {len(f.chunks)} chunk(s) of at most "
                                    f"{max_chunk_bytes} bytes", field=f"{at}.size")
    for i, f in enumerate(files):
        parts = f.path.split("/")
        for k in range(1, len(parts)):
            if "/".join(parts[:k]) in seen:
                raise InvalidInputError(f"{'/'.join(parts[:k])!r} is both a file and a folder", field=f"$.files[{i}]")


def chunks_of(files: Iterable[VolumeFile]) -> set[str]:
    return {sha for f in files for sha in f.chunks}


def unreferenced(candidates: Iterable[str], kept_versions: Iterable[Iterable[VolumeFile]]) -> set[str]:
    """The chunks of ``candidates`` that no kept version's files use."""
    used: set[str] = set()
    for files in kept_versions:
        used |= chunks_of(files)
    return set(candidates) - used
