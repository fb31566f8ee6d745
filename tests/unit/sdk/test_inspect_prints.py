"""An app that prints at its top level can be pushed: the inspector's stdout carries its JSON alone (the app's
prints, Python's or a C library's on file descriptor 1, go to stderr), so ``ember push`` and the node's build both
read it; what still cannot be read, or an import that never ends, is an ``InvalidSpecError`` that says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from ember import _build
from ember._build import plan_images
from ember._deploy import inspect_app
from ember._errors import InvalidSpecError
from ember.wire import Manifest
from ember_runtime.agent.builder import _decode, _module_files

APP = """import os
import ember

print("loading config...")
os.write(1, b"a C library's banner\\n")
app = ember.App("printy")


@app.function()
def hello(name: str) -> str:
    print("not at import: never run here")
    return f"hi {name}"
"""


@pytest.fixture
def app(tmp_path: Path) -> Path:
    path = tmp_path / "printy.py"
    path.write_text(APP)
    return path


def test_push_reads_the_manifest_and_the_plan_of_an_app_that_prints(app: Path) -> None:
    assert inspect_app(app).app == "printy"
    found = plan_images(app)
    assert found.manifest is not None and found.manifest.app == "printy"


def test_the_prints_go_to_stderr(app: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "ember._inspect", str(app)], capture_output=True, check=False,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert msgspec.json.decode(proc.stdout, type=Manifest).app == "printy"
    assert proc.stderr.decode().splitlines() == ["loading config...", "a C library's banner"]


def test_the_nodes_build_reads_the_manifest_line_and_the_modules_line(app: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "ember._inspect", "--modules", str(app), "printy"],
                          capture_output=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    raw, loaded = proc.stdout.partition(b"\n")[::2]  # as the builder splits it
    assert _decode(raw).app == "printy"
    assert any(str(f).endswith("ember/_app.py") for f in _module_files(loaded))


def test_output_push_cannot_read_is_an_invalid_spec_naming_it(app: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('welcome to this machine')\n")  # before Ember runs: its stdout
    monkeypatch.setenv("PYTHONPATH", str(site))
    with pytest.raises(InvalidSpecError, match="welcome to this machine"):
        plan_images(app)


def test_an_import_that_never_ends_is_an_invalid_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "slow.py"
    path.write_text("import time\nimport ember\n\ntime.sleep(8)\napp = ember.App('slow')\n")
    monkeypatch.setattr(_build, "INSPECT_TIMEOUT_S", 1.0, raising=False)
    with pytest.raises(InvalidSpecError, match="took over 1s"):
        plan_images(path)
