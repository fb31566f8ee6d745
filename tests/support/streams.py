"""Reading a child process's piped output beside the test."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any


def read_lines(stream: Any, put: Callable[[str], object]) -> threading.Thread:
    """A started daemon thread giving each line of ``stream`` to ``put``, until its end or until the test closes
    it (leaving a ``Popen`` block closes the pipe while the thread may still be reading: not a failure)."""

    def read() -> None:
        with contextlib.suppress(ValueError, OSError):
            for line in stream:
                put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader
