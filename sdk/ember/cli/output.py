"""Small text helpers for the CLI."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [list(map(str, headers)), *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def split_target(target: str) -> tuple[str, str]:
    """``APP.FN`` -> (app, fn); the function part may itself be ``Class.method``."""
    app, sep, fn = target.partition(".")
    if not sep or not app or not fn:
        raise SystemExit(f"ember: expected APP.FUNCTION (e.g. hello.greet or digits.Classifier.predict), "
                         f"got {target!r}")
    return app, fn


def progress_printer() -> Callable[[str, object], None]:
    """The progress lines of commands that wait (``push``, ``promote``, ``rollback``): ``[  1.2s] message`` on
    stderr, timed from now, so that stdout keeps only the outcome."""
    started = time.monotonic()

    def say(message: str, _view: object = None) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    return say
