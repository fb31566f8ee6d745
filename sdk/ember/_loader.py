"""Importing an app from its file: for ``ember push`` (to read the manifest) and in replicas."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from ember._app import App
from ember._errors import InvalidSpecError


def import_app_file(path: str | Path) -> tuple[ModuleType, str]:
    """Import an app's file as a top-level module, its folder first on ``sys.path``."""
    path = Path(path).resolve()
    if not path.is_file() or path.suffix != ".py":
        raise InvalidSpecError(f"{path} is not a Python file")
    return import_app_module(path.parent, path.stem), path.stem


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
