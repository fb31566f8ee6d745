"""Importing an app from its file: for ``ember push`` (to read the manifest) and in replicas."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from pathlib import Path
from types import CodeType, ModuleType

from ember._app import App
from ember._errors import InvalidSpecError


def import_app_file(path: str | Path) -> tuple[ModuleType, str]:
    """Import an app's file as a top-level module, its folder first on ``sys.path``."""
    path = Path(path).resolve()
    if not path.is_file() or path.suffix != ".py":
        raise InvalidSpecError(f"{path} is not a Python file")
    return import_app_module(path.parent, path.stem), path.stem


class _FromSource(importlib.machinery.SourceFileLoader):
    """A module compiled from its source, its ``__pycache__`` neither read nor written."""

    def get_code(self, fullname: str) -> CodeType:
        return self.source_to_code(self.get_data(self.path), self.path)


def read_from_source(root: str | Path) -> None:
    """From now on, import the modules of the folder ``root`` (and of its packages) from their source. Python takes a
    ``__pycache__`` file for a source whose time in seconds and size are the same: a file edited and pushed within
    the second it was last imported, its size unchanged, gave the manifest of the code before the edit (``ember
    push`` reads it) beside a bundle of the code after. Folders on ``sys.path`` of their own under ``root`` (a
    virtual environment's) keep their bytecode."""
    root = os.path.abspath(root)
    prefix = os.path.join(root, "")  # "/app/", or "/" for the root folder itself
    details = [(importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
               (_FromSource, importlib.machinery.SOURCE_SUFFIXES),
               (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES)]

    def hook(entry: str) -> importlib.machinery.FileFinder:
        where = os.path.abspath(entry or os.getcwd())
        others = {os.path.abspath(p or os.getcwd()) for p in sys.path if isinstance(p, str)} - {root}
        if not (where == root or where.startswith(prefix)) or any(
                where == o or where.startswith(os.path.join(o, "")) for o in others if o.startswith(prefix)):
            raise ImportError(entry)  # not the app's folder: the next hook's
        return importlib.machinery.FileFinder(where, *details)

    sys.path_hooks.insert(0, hook)
    sys.path_importer_cache.clear()


def import_app_module(root: str | Path, module: str) -> ModuleType:
    root = str(Path(root).resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(module)


def find_app(module: ModuleType, name: str | None = None) -> App:
    """The ``ember.App`` defined in ``module`` (the one called ``name`` where there are several)."""
    apps = [v for v in vars(module).values() if isinstance(v, App)]
    if name is not None:
        apps = [a for a in apps if a.name == name]
    if len(apps) != 1:
        found = ", ".join(a.name for a in apps) or "none"
        raise InvalidSpecError(
            f"{module.__name__}: expected one ember.App{f' named {name!r}' if name else ''}, found {found}; "
            "define `app = ember.App(\"name\")` at module level")
    return apps[0]
