"""Waiting on the real platform: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float = 60.0, what: str = "condition",
             every_s: float = 0.1, explain: Callable[[], str] | None = None) -> T:
    """``predicate()``'s first truthy value; AssertionError naming ``what`` after ``timeout_s``, with what
    ``explain()`` says then (a log's tail, say)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    said = f"\n{explain()}" if explain is not None else ""
    raise AssertionError(f"timed out waiting for {what}{said}")
