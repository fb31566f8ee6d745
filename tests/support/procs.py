"""The node's processes as the tests see them through ``/proc``."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited: no such process, or a zombie not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between the open and the read
        return True


def running(match: Callable[[list[bytes]], bool]) -> list[int]:
    """The processes alive (not zombies) whose command line, split into its arguments, ``match`` takes."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):  # gone meanwhile
            continue
        if state not in ("Z", "X") and match(argv):
            found.append(int(pid))
    return found
