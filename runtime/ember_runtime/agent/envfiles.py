"""The files of an image's environment that the node agent writes and trusts, and only those.

A package's wheel may install data files (``<dist>.data/data/...``) at the environment's root, beside what the agent
writes there: one named ``pyvenv.cfg`` whose ``home`` names a folder of the tenant's choice made the interpreter
that compiles the environment's bytecode on the node (outside any sandbox) load that folder's standard library, and
made every sandbox of the image bind that folder read-only. So the agent keeps ``pyvenv.cfg`` as ``uv venv`` wrote it
(before any package was installed) and writes it again after the installs, writes its own marks anew (never through
a file a package put there, which may be a hard link into uv's cache), and takes the base interpreter's prefix from
its own ready mark, never from the environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

VENV_CFG = "pyvenv.cfg"


def home_of(cfg: str) -> str:
    """``home`` of a pyvenv.cfg's text ("" if none)."""
    for line in cfg.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return value.strip()
    return ""


def write_own(path: Path, text: str) -> None:
    """``text`` as the whole of ``path``, a file of the agent's own: whatever a package installed there first (a
    file, a hard link, a link, a folder) is removed, not written through."""
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def base_prefix(ready: Path) -> Path | None:
    """The prefix of the interpreter an environment was made from, as its ready mark (the agent's) says; None for
    a mark that says none (an environment built before marks said it: built again)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        home = json.loads(ready.read_text()).get("home")
        if isinstance(home, str) and home.startswith("/"):
            return Path(home).resolve().parent
    return None


def site_packages(folder: Path) -> Path | None:
    found = sorted(folder.glob("lib/python3*/site-packages"))
    return found[0] if found else None
