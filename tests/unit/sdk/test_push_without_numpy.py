"""Pushing an app whose image has numpy from a machine without it: the inspector stands in for numpy, and an
annotation that is or holds a stand-in is read as ``Any`` (a stand-in ``numpy.ndarray`` as an array), so that
push reads the app's declared manifest and the node's import inside the image refines its schemas."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from ember._plan import ImagePlan
from ember.wire import FunctionSpec, Manifest

# Imported by Python at start-up from PYTHONPATH: numpy cannot be found, as on a machine that never installed it.
HIDE_NUMPY = """import importlib.machinery
import sys


class _WithoutNumpy(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.partition(".")[0] == "numpy" else super().find_spec(name, path, target)


sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = _WithoutNumpy
"""

APP = """from collections.abc import Iterator
from typing import Annotated

import numpy as np

import ember

app = ember.App("embedder", image=ember.Image().pip_install("numpy"))
Pixels = Annotated[np.ndarray, ember.Tensor(dtype="float32", shape=(None, 3))]


@app.function()
def embed(pixels: np.ndarray) -> np.ndarray:
    return pixels * 2


@app.function()
def typed(pixels: Pixels) -> Annotated[np.ndarray, ember.Tensor(dtype="float32")]:
    return pixels


@app.function()
def frames(n: int) -> Iterator[np.ndarray]:
    yield np.zeros(n)


@app.function(batch=ember.Batch(max_size=4))
def batched(xs: list[np.ndarray]) -> list[float]:
    return [float(x.sum()) for x in xs]
"""

# Valid only without numpy (msgspec reads no ndarray in a dict): what holds a stand-in is read as Any.
NAMED = """

@app.function()
def named(arrays: dict[str, np.ndarray], scale: float = 1.0) -> list[str]:
    return sorted(arrays)


@app.function()
def maybe(pixels: np.ndarray | None = None) -> None | np.ndarray:
    return pixels
"""


def _inspect(app: Path, *flags: str, hide: Path | None = None) -> bytes:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(hide or ""), os.environ.get("PYTHONPATH", ""))
                                                       if p)}
    proc = subprocess.run([sys.executable, "-m", "ember._inspect", *flags, str(app)], capture_output=True,
                          check=False, timeout=120, env=env, cwd=app.parent)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "app").mkdir()
    path = tmp_path / "app" / "embedder.py"
    path.write_text(APP)
    return path


@pytest.fixture
def hide(tmp_path: Path) -> Path:
    folder = tmp_path / "without-numpy"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(HIDE_NUMPY)
    return folder


def _functions(manifest: Manifest) -> dict[str, FunctionSpec]:
    return {f.name: f for s in manifest.services for f in s.functions}


def test_push_reads_the_declared_manifest_with_numpy_stood_in_for(app: Path, hide: Path) -> None:
    app.write_text(APP + NAMED)
    found = msgspec.json.decode(_inspect(app, "--images", hide=hide), type=ImagePlan)
    assert found.missing == ["numpy"] and found.manifest is None and found.declared is not None
    fns = _functions(found.declared)
    assert fns["embed"].input_schema == fns["embed"].output_schema == {"type": "array"}
    assert fns["typed"].tensors is not None and [t.datatype for t in fns["typed"].tensors.inputs] == ["FP32"]
    assert fns["typed"].input_schema["items"] == {"type": "array", "items": {"type": "number"}, "minItems": 3,
                                                   "maxItems": 3}
    named = fns["named"].input_schema["$defs"]["named_args"]["properties"]
    assert named == {"arrays": {}, "scale": {"type": "number", "default": 1.0}}  # Any: the node's import refines it
    assert fns["frames"].stream and fns["frames"].output_schema == {"type": "array"}
    assert fns["batched"].batch is not None and fns["batched"].input_schema == {"type": "array"}
    assert fns["maybe"].output_schema == {}  # a union with a stand-in: Any (before, `|` failed the import)


def test_the_arrays_declared_without_numpy_are_those_the_image_reads(app: Path, hide: Path) -> None:
    declared = msgspec.json.decode(_inspect(app, "--images", hide=hide), type=ImagePlan).declared
    assert declared is not None
    real = msgspec.json.decode(_inspect(app), type=Manifest)  # as the node reads it, numpy there
    for name, fn in _functions(real).items():
        assert _functions(declared)[name].tensors == fn.tensors, name
