"""``python -m ember._inspect app.py``: import an app and print its manifest as JSON.

``ember push`` runs this in a subprocess so that importing user code (and its heavy imports) never
happens in the CLI's own process. With ``--images`` it imports the app as written, standing in only for a
top-level package this machine lacks that the app's own files import (``ember._lenient``), and prints its images
(``ember._plan.ImagePlan``): the platform then reads the manifest by importing the app inside its image, on a node
(``python -m ember._inspect`` with the image's Python). With ``--modules`` the manifest's line is followed by one
more: the files of the modules the import loaded, from which the node compiles
the bytecode replicas will read (``ember_runtime.agent.bytecode``).
"""

from __future__ import annotations

import importlib
import runpy
import sys
import traceback
from pathlib import Path

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
    try:
        return _main(argv)
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


def _main(argv: list[str]) -> int:
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
        sys.stdout.buffer.write(encoder.encode(found) + b"\n")
        return 0
    try:
        module, name = import_app_file(argv[0])
        app = find_app(module, argv[1] if len(argv) == 2 else None)
        manifest = app.manifest(name)
    except EmberError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.buffer.write(encoder.encode(manifest) + b"\n")
    if modules:
        sys.stdout.buffer.write(encoder.encode(loaded_files()) + b"\n")
    return 0


def loaded_files() -> list[str]:
    """The source files of the modules loaded so far (the node keeps those of its environment)."""
    files = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
    return sorted(f for f in files if isinstance(f, str) and f.endswith(".py"))[:MAX_MODULE_FILES]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
