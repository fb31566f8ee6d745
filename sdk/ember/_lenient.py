"""Importing an app on a machine that lacks packages only its image has, so that the app file's top level runs far
enough to declare its app and its images.

Only ``ember push`` does this, to learn the app's name and its images; the manifest itself is read on the platform,
by importing the app inside its image (see docs/guides/images.md). The app is imported as written first; only a
top-level package that this machine does not have, imported by the app's own files (its folder, not an installed
package), is then stood in for, and the import tried again. Nothing under an installed package is ever stood in for:
not a submodule it lacks, not an optional import it tries inside ``try/except ImportError`` (numpy's, torch's), so
installed packages import exactly as they would without Ember. A stand-in accepts attribute access, calls,
subscripts and subclassing; code that needs a real value at import time (``np.zeros(3).shape[0] + 1``) still
fails, with an error naming the missing package.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import site
import sys
import sysconfig
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, ModuleType, TracebackType
from typing import Any

from ember._errors import InvalidSpecError
from ember._loader import import_app_file

OWN = ("ember", "ember_runtime", "ember_platform")  # a missing part of Ember is a real error
MAX_STAND_INS = 100


class Stub:
    """Anything taken from a module this machine does not have."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_stub_name", name)

    def __getattr__(self, attr: str) -> Stub:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self._stub_name}.{attr}")

    def __setattr__(self, attr: str, value: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], Stub):
            return args[0]  # a decorator from a missing package: the function stays itself
        return Stub(f"{self._stub_name}(...)")

    def __getitem__(self, key: Any) -> Stub:
        return Stub(f"{self._stub_name}[...]")

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __or__(self, other: Any) -> Stub:  # an annotation such as ``np.ndarray | None``
        return Stub(f"{self._stub_name} | ...")

    def __ror__(self, other: Any) -> Stub:
        return Stub(f"... | {self._stub_name}")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __repr__(self) -> str:
        return f"<missing {self._stub_name}>"


class _StubModule(ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__all__: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self.__name__}.{attr}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return _StubModule(spec.name)

    def exec_module(self, module: ModuleType) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: asked only for what no real finder found, it stands in for the packages named in
    ``missing`` (and their submodules), and only when the app's own files import them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.missing: list[str] = []

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name.partition(".")[0] not in self.missing or not _is_app_file(_importer(sys._getframe(1)), self.root):
            return None
        return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)


@contextmanager
def stand_ins(root: Path) -> Iterator[list[str]]:
    """While active, the packages ``import_standing_in`` found missing are stand-ins for the app's files under
    ``root``; yields their names."""
    finder = _Finder(root.resolve())
    original = builtins.__import__

    def guarded(name: str, globals: Mapping[str, object] | None = None, locals: Mapping[str, object] | None = None,
                fromlist: Sequence[str] | None = (), level: int = 0) -> ModuleType:
        """An installed package's ``import`` of a package stood in for fails as it would without Ember, even once
        the app's own import has put the stand-in in ``sys.modules``."""
        if level == 0 and name.partition(".")[0] in finder.missing and \
                not _is_app_file(str((globals or {}).get("__file__") or ""), finder.root):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return original(name, globals, locals, fromlist, level)

    sys.meta_path.append(finder)
    builtins.__import__ = guarded
    try:
        yield finder.missing
    finally:
        builtins.__import__ = original
        sys.meta_path.remove(finder)


def import_standing_in(path: str | Path, missing: list[str]) -> tuple[ModuleType, str]:
    """Import the app file as written; while that fails for want of a top-level package this machine does not
    have, imported by the app's own files, add that package to ``missing`` (the list ``stand_ins`` yielded) and
    try again. Any other failure to import is the app's error, raised as it is or naming what is missing."""
    root = Path(path).resolve().parent
    for _ in range(MAX_STAND_INS):
        try:
            return import_app_file(path)
        except ModuleNotFoundError as exc:
            missing.append(_standable(exc, root, missing))
    raise InvalidSpecError(f"importing {Path(path).name} needs more than {MAX_STAND_INS} packages this machine "
                           "does not have")


def _standable(exc: ModuleNotFoundError, root: Path, missing: list[str]) -> str:
    """The top-level package ``exc`` says is missing, when a stand-in may take its place; else the app's error."""
    if not exc.name:
        raise exc
    name, top = exc.name, exc.name.partition(".")[0]
    importer = _traceback_importer(exc.__traceback__)
    where = _shown(importer, root)
    if top in OWN or top in sys.stdlib_module_names:
        raise InvalidSpecError(f"{where} imports {name}, which does not exist (no module named {name!r})") from None
    if top in missing or not _is_app_file(importer, root):
        raise InvalidSpecError(
            f"{where} imports {top}, which this machine does not have: install {top} here (only the app's own "
            "imports are stood in for, never an installed package's)") from None
    if _installed(top):
        raise InvalidSpecError(f"{where} imports {name}, which the installed {top} does not have "
                               f"(no module named {name!r})") from None
    return top


def _installed(top: str) -> bool:
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return True  # there, if broken: its own error stands


def _shown(importer: str, root: Path) -> str:
    """A file as an error names it: the app's relative to its folder, an installed package's in full."""
    if not importer:
        return "the app"
    file = Path(importer).resolve()
    return str(file.relative_to(root)) if file.is_relative_to(root) else importer


def _importer(frame: FrameType | None) -> str:
    """The file of the innermost frame outside the import machinery (and this module): who asked for a module."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith("<frozen importlib") or name == __file__ or _in_importlib(name)):
            return name
        frame = frame.f_back
    return ""


def _in_importlib(name: str) -> bool:
    return Path(name).parent == Path(importlib.util.__file__).parent


def _is_app_file(name: str, root: Path) -> bool:
    """Whether ``name`` is one of the app's own files: under its folder, and not in an installed package (a
    virtual environment kept beside the app is not the app)."""
    if not name or name.startswith("<"):
        return False
    file = Path(name).resolve()
    if not file.is_relative_to(root):
        return False
    return not any(file.is_relative_to(p) and not root.is_relative_to(p) for p in _installed_roots())


def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    found = [paths[k] for k in ("purelib", "platlib", "stdlib", "platstdlib") if k in paths]
    found += [*site.getsitepackages(), site.getusersitepackages(), sys.prefix, sys.base_prefix]
    return [Path(p).resolve() for p in dict.fromkeys(found)]


def _traceback_importer(tb: TracebackType | None) -> str:
    """The file whose import statement failed: the last frame of the traceback outside the import machinery."""
    found = ""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name.startswith("<frozen importlib") or name == __file__ or _in_importlib(name)):
            found = name
        tb = tb.tb_next
    return found
