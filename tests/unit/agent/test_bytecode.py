"""The bytecode the node compiles for what an app imported from its image: only regular ``.py`` files inside the
environment, whatever list the app's process wrote; compiled without running anything of the environment."""

from __future__ import annotations

import asyncio
import subprocess
import venv
from pathlib import Path

from ember_runtime.agent import bytecode


def _env(tmp_path: Path) -> Path:
    root = tmp_path / "env"
    package = root / "lib" / "site-packages" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "lazy.py").write_text("VALUE = 2\n")
    return root


def test_only_python_files_inside_the_environment_are_selected(tmp_path: Path):
    root = _env(tmp_path)
    package = root / "lib" / "site-packages" / "pkg"
    outside = tmp_path / "outside.py"
    outside.write_text("x = 1\n")
    (package / "escape.py").symlink_to(outside)  # a link inside that leads out
    (package / "data.txt").write_text("not python\n")
    (package / "dir.py").mkdir()
    chosen = bytecode.selected(root, [
        str(package / "__init__.py"), str(package / "__init__.py"), str(outside), str(package / "escape.py"),
        str(package / "data.txt"), str(package / "dir.py"), str(package / "missing.py"),
        f"{package}/../../../../outside.py", "lib/site-packages/pkg/lazy.py", f"{package}/lazy.py\0", 7, None,
        str(root / "lib" / "site-packages" / "pkg" / ".." / "pkg" / "lazy.py")])
    assert chosen == [package / "__init__.py", package / "lazy.py"]


def test_the_selected_files_are_compiled_and_nothing_of_the_environment_runs(tmp_path: Path):
    root = tmp_path / "env"
    venv.create(root, with_pip=False, symlinks=True)  # an environment as the node builds them
    (site,) = root.glob("lib/python*/site-packages")
    package = site / "pkg"
    package.mkdir()
    marker = tmp_path / "ran"
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")  # runs if imported
    (package / "lazy.py").write_text("VALUE = 2\n")
    (site / "evil.pth").write_text(f"import os; open({str(marker)!r}, 'w').close()\n")  # runs at any start with site
    python = root / "bin" / "python"
    count = asyncio.run(bytecode.compile_imported(root, python, [str(package / "__init__.py")]))
    assert count == 1
    assert [p.name.split(".")[0] for p in (package / "__pycache__").iterdir()] == ["__init__"]  # not lazy.py
    assert not marker.exists()
    subprocess.run([str(python), "-c", "pass"], check=True)
    assert marker.exists()  # the same interpreter started as usual would have run the .pth


def test_nothing_to_compile_starts_nothing(tmp_path: Path):
    root = _env(tmp_path)
    assert asyncio.run(bytecode.compile_imported(root, tmp_path / "no-python", ["/etc/passwd", "x.py"])) == 0
