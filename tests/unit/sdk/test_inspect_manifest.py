"""``python -m ember._inspect APP_FILE``: the manifest of an app file, read in a fresh interpreter."""

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from support.paths import REPO

from ember._deploy import inspect_app
from ember.wire import Manifest


def _inspect(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "ember._inspect", *map(str, args)], capture_output=True,
                          timeout=120, check=False, cwd=cwd)


def test_hello_manifest() -> None:
    proc = _inspect("examples/hello/hello.py")
    assert proc.returncode == 0, proc.stderr.decode()
    manifest = msgspec.json.decode(proc.stdout, type=Manifest)
    assert (manifest.app, manifest.module) == ("hello", "hello")
    assert [s.name for s in manifest.services] == ["greet", "add", "norm", "echo"]
    assert all(s.kind == "function" and len(s.functions) == 1 for s in manifest.services)
    modes = {s.name: s.functions[0].input_mode for s in manifest.services}
    assert modes == {"greet": "single", "add": "kwargs", "norm": "single", "echo": "single"}
    (echo,) = manifest.services[3].functions
    assert echo.batch is not None and echo.batch.max_size == 64
    # Importing the app runs no function: greet() would print.
    assert b"greeting" not in proc.stdout + proc.stderr


def test_app_chosen_by_name(tmp_path: Path) -> None:
    (tmp_path / "two.py").write_text("import ember\na = ember.App('first')\nb = ember.App('second')\n"
                                     "@b.function\ndef f() -> int:\n    return 1\n")
    proc = _inspect(tmp_path / "two.py", "second", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    manifest = msgspec.json.decode(proc.stdout, type=Manifest)
    assert (manifest.app, [s.name for s in manifest.services]) == ("second", ["f"])


@pytest.mark.parametrize(("source", "message"), [
    ("X = 1\n", "expected one ember.App, found none; define `app = ember.App(\"name\")` at module level"),
    ("import ember\na = ember.App('one')\nb = ember.App('two')\n", "expected one ember.App, found one, two"),
    ("import ember\napp = ember.App('Bad Name')\n", "an app name is 1-63 lowercase letters"),
])
def test_bad_app_file_exits_2(tmp_path: Path, source: str, message: str) -> None:
    (tmp_path / "noapp.py").write_text(source)
    proc = _inspect(tmp_path / "noapp.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert proc.stderr.decode().startswith("error: ")
    assert message in proc.stderr.decode()


def test_unknown_app_name_exits_2(tmp_path: Path) -> None:
    proc = _inspect(REPO / "examples/hello/hello.py", "nope", cwd=tmp_path)
    assert proc.returncode == 2
    assert "expected one ember.App named 'nope', found none" in proc.stderr.decode()


@pytest.mark.parametrize("name", ["missing.py", "notes.txt"])
def test_not_a_python_file_exits_2(tmp_path: Path, name: str) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    proc = _inspect(tmp_path / name, cwd=tmp_path)
    assert proc.returncode == 2
    assert "is not a Python file" in proc.stderr.decode()


def test_usage_exits_2() -> None:
    proc = _inspect()
    assert proc.returncode == 2
    assert b"usage: python -m ember._inspect [--images | --modules] APP_FILE [APP_NAME]" in proc.stderr


def test_a_file_edited_in_the_second_of_its_last_import_is_read_as_it_is_now(tmp_path: Path) -> None:
    """Python takes a ``__pycache__`` file for a source of the same size whose time in seconds is the same: the
    push read the manifest of the code before the edit (and bundled the code after it)."""
    path = tmp_path / "edited.py"
    source = "import ember\napp = ember.App('edited')\n\n@app.function(max_concurrency={n})\ndef f(x: int) -> int:\n" \
             "    return x\n"
    path.write_text(source.format(n=4))
    os.utime(path, (1_800_000_000, 1_800_000_000))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", "import edited"], cwd=tmp_path, env=env, check=True, timeout=120)
    assert list((tmp_path / "__pycache__").glob("edited.*.pyc"))  # run here once, as its author would
    path.write_text(source.format(n=8))  # the same size, the same second
    os.utime(path, (1_800_000_000, 1_800_000_000))
    (fn,) = inspect_app(path).services[0].functions
    assert fn.max_concurrency == 8
