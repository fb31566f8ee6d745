"""``python -m ember._inspect app.py``: import an app and print its manifest as JSON.

``ember push`` runs this in a subprocess so that importing user code (and its heavy imports) never
happens in the CLI's own process. With ``--images`` it imports the app as written, standing in only for a
top-level package this machine lacks that the app's own files import (``ember._lenient``), and prints its images
(``ember._plan.ImagePlan``): the platform then reads the manifest by importing the app inside its image, on a node
(``python -m ember._inspect`` with the image's Python). With ``--modules`` the manifest's line is followed by one
more: the files of the modules the import loaded, from which the node compiles
the bytecode replicas will read (``ember_runtime.agent.bytecode``).

The process's stdout carries that JSON alone: whatever the app prints while it imports (``print``, a C library's
write to file descriptor 1) goes to stderr, so that ``ember push`` and the node's build read its lines as they are.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import BinaryIO

from ember._errors import EmberError
from ember._loader import find_app, import_app_file, read_from_source
from ember._plan import plan
from ember.wire import encoder

MAX_MODULE_FILES = 20_000
# Where the frames that only carry an app's import come from: Ember's SDK and the import machinery (the frozen
# importlib frames are told apart by their "<frozen ...>" file names).
_CARRIERS = (str(Path(__file__).resolve().parent), str(Path(importlib.__file__ or "/-").resolve().parent),
             str(Path(runpy.__file__ or "/-").resolve()))


def main(argv: list[str]) -> int:
    out = keep_stdout()
    try:
        return _main(argv, out)
    except Exception as exc:  # the app's own error, raised while importing it
        print(app_traceback(exc), end="", file=sys.stderr)
        return 1


def app_traceback(exc: BaseException) -> str:
    """``exc``'s traceback from the first frame that is not Ember's or the import machinery's: the frames that
    carried the import say nothing to whoever wrote the app (a syntax error keeps no frame at all, only its line)."""
    tb = exc.__traceback__
    while tb is not None and _carrier(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _carrier(filename: str) -> bool:
    if filename.startswith("<frozen "):
        return True
    try:
        path = str(Path(filename).resolve())
    except (OSError, RuntimeError):
        return False
    return path.startswith(_CARRIERS)


def keep_stdout() -> BinaryIO:
    """The process's stdout, kept for the JSON: file descriptor 1 and ``sys.stdout`` now point at stderr, so that
    what the app prints on import goes there and never into the lines ``ember push`` and the node decode."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(saved, "wb")


def _main(argv: list[str], out: BinaryIO) -> int:
    lenient = bool(argv) and argv[0] == "--images"
    modules = bool(argv) and argv[0] == "--modules"
    argv = argv[1:] if lenient or modules else argv
    if len(argv) not in (1, 2):
        print("usage: python -m ember._inspect [--images | --modules] APP_FILE [APP_NAME]", file=sys.stderr)
        return 2
    read_from_source(Path(argv[0]).resolve().parent)  # what the app's files say now, never an older __pycache__
    if lenient:
        try:
            found = plan(argv)
        except EmberError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        out.write(encoder.encode(found) + b"\n")
        out.flush()
        return 0
    try:
        module, name = import_app_file(argv[0])
        app = find_app(module, argv[1] if len(argv) == 2 else None)
        manifest = app.manifest(name)
    except EmberError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out.write(encoder.encode(manifest) + b"\n")
    if modules:
        out.write(encoder.encode(loaded_files()) + b"\n")
    out.flush()
    return 0


def loaded_files() -> list[str]:
    """The source files of the modules loaded so far (the node keeps those of its environment)."""
    files = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
    return sorted(f for f in files if isinstance(f, str) and f.endswith(".py"))[:MAX_MODULE_FILES]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
