"""The node's processes as the tests see them through ``/proc``."""

from __future__ import annotations

from pathlib import Path


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited: no such process, or a zombie not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between the open and the read
        return True
