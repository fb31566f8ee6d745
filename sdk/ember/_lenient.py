"""Importing an app on a machine that lacks packages only its image has: each module that cannot be found is
replaced by a stand-in, so that the app file's top level runs far enough to declare its app and its images.

Only ``ember push`` does this, to learn the app's name and its images; the manifest itself is read on the platform,
by importing the app inside its image (see README, "Images"). A stand-in accepts attribute access, calls,
subscripts and subclassing; code that needs a real value at import time (``np.zeros(3).shape[0] + 1``) still
fails, with an error naming the missing package.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any


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
    """Last on ``sys.meta_path``: asked only for what no real finder found."""

    def __init__(self) -> None:
        self.missing: list[str] = []

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        top = name.partition(".")[0]
        if top in ("ember", "ember_runtime", "ember_platform") or top in sys.stdlib_module_names:
            return None  # a missing part of Ember or of the standard library is a real error
        if top not in self.missing:
            self.missing.append(top)
        return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)


@contextmanager
def missing_modules_stubbed() -> Iterator[list[str]]:
    """While active, a module that cannot be imported is a stand-in; yields the names of those stood in for."""
    finder = _Finder()
    sys.meta_path.append(finder)
    try:
        yield finder.missing
    finally:
        sys.meta_path.remove(finder)
