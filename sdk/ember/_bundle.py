"""Bundles: a deterministic, content-addressed archive of an app's source folder."""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import re
import subprocess
import tarfile
from collections import Counter
from pathlib import Path
from zlib import error as zlib_error

from ember._errors import InvalidSpecError

MAX_BUNDLE_BYTES = 256 * 1024 * 1024
MAX_UNPACKED_BYTES = 512 * 1024 * 1024  # a bundle's files, unpacked, all together
MAX_FILES = 10_000
MAX_PATH = 1024
GIT_TIMEOUT_S = 30.0
_SKIP_DIRS = {".git", ".hg", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
              "node_modules", ".ember", ".ipynb_checkpoints"}
_ADVICE = "list large files in .gitignore and load them at setup from storage (a volume)"
_SKIP_FILES = ("*.pyc", "*.pyo", ".DS_Store", "*.swp")


class Bundle:
    """An archive's bytes and their sha256 (the bundle's address); ``skipped``: the links left out, their targets
    outside the folder (a push says which)."""

    def __init__(self, data: bytes, files: list[str], skipped: list[str] | None = None) -> None:
        self.data = data
        self.files = files
        self.skipped = skipped or []
        self.sha256 = hashlib.sha256(data).hexdigest()

    def __repr__(self) -> str:
        return f"<Bundle {self.sha256[:12]} {len(self.files)} files, {len(self.data)} bytes>"


def build_bundle(root: str | os.PathLike[str]) -> Bundle:
    """Pack ``root`` into a gzip'd tar whose bytes depend only on the files' paths, contents and modes. A folder
    past the limits an upload is held to (``MAX_FILES``, ``MAX_UNPACKED_BYTES``) is refused before anything is
    read or compressed."""
    root = Path(root).resolve()
    files, skipped = select_files(root)
    _check_sizes(root, files)
    raw = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            path = root / rel
            info = tarfile.TarInfo(rel)
            info.size = path.stat().st_size
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.mtime = 0
            with path.open("rb") as fh:
                tar.addfile(info, fh)
    data = raw.getvalue()
    if len(data) > MAX_BUNDLE_BYTES:
        raise InvalidSpecError(
            f"the bundle of {root} is {len(data) >> 20} MiB, over the {MAX_BUNDLE_BYTES >> 20} MiB limit; "
            f"{_ADVICE}")
    return Bundle(data, files, skipped)


def _check_sizes(root: Path, files: list[str]) -> None:
    """``BundleTooLargeError`` naming the limit and where the bulk is, for files over the count or unpacked size a
    bundle may hold: found by their sizes, not by gzipping gigabytes in memory first."""
    if len(files) > MAX_FILES:
        folders = Counter(rel.rpartition("/")[0] or "." for rel in files).most_common(3)
        raise BundleTooLargeError(
            f"{root} holds {len(files)} files to bundle, over the limit of {MAX_FILES}; the most are in "
            + ", ".join(f"{folder}/ ({n})" for folder, n in folders) + f"; {_ADVICE}")
    sizes = {rel: (root / rel).stat().st_size for rel in files}
    total = sum(sizes.values())
    if total > MAX_UNPACKED_BYTES:
        largest = sorted(sizes, key=lambda rel: (-sizes[rel], rel))[:3]
        raise BundleTooLargeError(
            f"the files of {root} come to {total / 2**20:.0f} MiB, over the {MAX_UNPACKED_BYTES >> 20} MiB limit of "
            "a bundle; the largest are " + ", ".join(f"{rel} ({sizes[rel] / 2**20:.0f} MiB)" for rel in largest)
            + f"; {_ADVICE}")


def list_files(root: Path) -> list[str]:
    """Files under ``root`` to bundle, as sorted POSIX paths: in a git work tree the files git would commit (every
    ignore source counts: ``.gitignore`` files above and below, ``.git/info/exclude``, the global excludes), else
    the folder's own, less its root ``.gitignore``'s; never caches, ``.env`` files or a virtual environment."""
    return select_files(root)[0]


def select_files(root: Path) -> tuple[list[str], list[str]]:
    """``list_files``, and the files left out because they are links whose target resolves outside ``root`` (as a
    volume's are): a link to ``~/.aws/credentials`` is never packed. Both sorted."""
    root = root.resolve()
    venvs: dict[Path, bool] = {}
    kept, outside = set[str](), set[str]()
    for rel in _candidates(root):
        path = root / rel
        if not _wanted(root, rel, venvs) or not path.is_file():
            continue
        (kept if path.resolve().is_relative_to(root) else outside).add(rel)
    return sorted(kept), sorted(outside)


def _candidates(root: Path, depth: int = 0) -> list[str]:
    """The paths git lists under ``root`` (a nested repository or submodule listed in its turn), or the walker's
    where git is missing, fails or lists nothing (a folder outside a work tree, or one that git ignores whole)."""
    listed = _git_files(root)
    if not listed:
        return _walk(root)
    out = []
    for rel in listed:
        rel = rel.rstrip("/")
        if depth < 8 and (root / rel).is_dir() and not (root / rel).is_symlink():  # a repository of its own
            out += [f"{rel}/{inner}" for inner in _candidates(root / rel, depth + 1)]
        else:
            out.append(rel)
    return out


def _git_files(root: Path) -> list[str]:
    """``git ls-files`` of the tracked and untracked files under ``root`` that no ignore source excludes, relative to
    it; none where git is missing or ``root`` is in no work tree. One call: cheap enough for ``ember dev --watch``'s
    poll."""
    cmd = ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode != 0:
        return []
    return [os.fsdecode(raw) for raw in proc.stdout.split(b"\0") if raw]


def _walk(root: Path) -> list[str]:
    """The files under ``root`` less those its root ``.gitignore`` names (outside a git work tree)."""
    ignore = _gitignore(root)
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not (Path(dirpath) / d / "pyvenv.cfg")
                             .is_file() and not _ignored((rel_dir / d).as_posix(), True, ignore))
        out += [rel for name in filenames if not _ignored(rel := (rel_dir / name).as_posix(), False, ignore)]
    return out


def _wanted(root: Path, rel: str, venvs: dict[Path, bool]) -> bool:
    """Whether a listed path may be bundled, whatever listed it: not in a skipped folder or a virtual environment
    (any folder holding a ``pyvenv.cfg``, whatever its name), not a cache or an ``.env`` file."""
    *folders, name = rel.split("/")
    if any(part in _SKIP_DIRS for part in folders) or any(fnmatch.fnmatch(name, p) for p in _SKIP_FILES):
        return False
    if name == ".env" or name.startswith(".env."):
        return False
    here = root
    for part in folders:
        here = here / part
        if here not in venvs:
            venvs[here] = (here / "pyvenv.cfg").is_file()
        if venvs[here]:
            return False
    return True


_Rule = tuple[re.Pattern[str], bool, bool]  # (regex over the relative path, directories only, negated)


def _gitignore(root: Path) -> list[_Rule]:
    """The root ``.gitignore``'s rules, with git's meaning of ``/``, ``*``, ``?`` and ``**``."""
    path = root / ".gitignore"
    if not path.is_file():
        return []
    rules = []
    for line in path.read_text().splitlines():
        line = line.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        dir_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        anchored = "/" in pattern  # a slash at the start or in the middle anchors it to the root
        rules.append((re.compile(("" if anchored else "(?:.*/)?") + _glob_regex(pattern.lstrip("/"))), dir_only,
                      negate))
    return rules


def _glob_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1:]:
            close = pattern.index("]", i + 1)
            out.append("[" + pattern[i + 1:close].replace("!", "^", 1) + "]")
            i = close + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def _ignored(rel: str, is_dir: bool, rules: list[_Rule]) -> bool:
    ignored = False
    for regex, dir_only, negate in rules:
        if (is_dir or not dir_only) and regex.fullmatch(rel):
            ignored = not negate
    return ignored


class BundleTooLargeError(InvalidSpecError):
    """A bundle over a size or count limit (413 at upload)."""


def check_bundle(data: bytes, *, max_unpacked_bytes: int = MAX_UNPACKED_BYTES, max_files: int = MAX_FILES) -> int:
    """The unpacked size of a bundle whose every member is a plain file or folder at a relative path inside it,
    within the limits; otherwise ``InvalidSpecError`` (or ``BundleTooLargeError``) naming the member.

    It reads the archive's headers in order and stops at the first that breaks a rule, before the content
    behind it is decompressed: a small upload that would unpack to gigabytes is refused by its declared sizes.
    """
    total, count, seen = 0, 0, set[str]()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar:
                count += 1
                if count > max_files:
                    raise BundleTooLargeError(f"the bundle holds more than {max_files} members")
                _check_member(member, seen)
                total += member.size
                if total > max_unpacked_bytes:
                    raise BundleTooLargeError(f"the bundle unpacks to more than {max_unpacked_bytes} bytes "
                                              f"(at {member.name!r})")
    except (tarfile.TarError, EOFError, OSError, zlib_error) as exc:
        raise InvalidSpecError(f"not a gzip'd tar archive: {exc}") from exc
    return total


def _check_member(member: tarfile.TarInfo, seen: set[str]) -> None:
    name = member.name
    if not (member.isreg() or member.isdir()):
        raise InvalidSpecError(f"bundle member {name!r}: only files and folders, not links or devices")
    parts = name.split("/")
    if not name or len(name) > MAX_PATH or name.startswith("/") or "\0" in name or "\\" in name \
            or any(p in ("", ".", "..") for p in parts[:-1]) or parts[-1] in (".", ".."):
        raise InvalidSpecError(f"bundle member {name[:200]!r}: a relative path inside the bundle, without '..'")
    if member.isreg() and name in seen:
        raise InvalidSpecError(f"bundle member {name!r} appears twice")
    seen.add(name)


def unpack_bundle(data: bytes, dest: str | os.PathLike[str]) -> None:
    """Extract a bundle safely: every member checked first by ``check_bundle``'s rules (plain files and folders, at
    paths inside the bundle; a leading ``/`` is dropped, as the data filter does), so that no link or device is
    ever extracted; ``tarfile.FilterError`` naming the first that breaks them, before anything is written. The data
    filter alone is not enough: some Python releases let a chain of symlinks lead it out of ``dest``."""
    seen = set[str]()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        for member in members:
            try:
                _check_member(member.replace(name=member.name.lstrip("/"), deep=False), seen)
            except InvalidSpecError as exc:
                raise tarfile.FilterError(str(exc)) from exc
        tar.extractall(dest, members=members, filter="data")
