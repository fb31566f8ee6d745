"""What a bundle holds in a git work tree: the files git would commit, every ignore source counted (parent and
nested ``.gitignore`` files, ``.git/info/exclude``, the global excludes), and, whatever listed them, never caches,
``.env`` files, a virtual environment of any name, or a tracked file since deleted."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ember._bundle import build_bundle, list_files
from ember.dev.watch import snapshot


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A monorepo whose app lives two folders down, git's global excludes a file of the test's own."""
    excludes = tmp_path / "global-excludes"
    excludes.write_text("*.globalsecret\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    (tmp_path / "gitconfig").write_text(f"[core]\n\texcludesFile = {excludes}\n")
    root = tmp_path / "mono"
    root.mkdir()
    _git(root, "init", "-q", ".")
    _write(root, {".gitignore": "*.pem\nsecrets/\n", "services/model/app.py": "import ember\n"})
    return root


def test_every_ignore_source_of_the_work_tree_counts(repo: Path) -> None:
    app = repo / "services" / "model"
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("*.excluded\n")
    _write(app, {"server.pem": "KEY", "secrets/a.json": "{}", "sub/.gitignore": "local.json\n",
                 "sub/local.json": "{}", "sub/kept.json": "{}", "notes.excluded": "x", "aws.globalsecret": "x"})
    assert list_files(app) == ["app.py", "sub/.gitignore", "sub/kept.json"]
    assert build_bundle(app).files == ["app.py", "sub/.gitignore", "sub/kept.json"]


def test_env_files_and_virtual_environments_are_never_bundled_even_when_git_lists_them(repo: Path) -> None:
    app = repo / "services" / "model"
    _write(app, {".env": "HF_TOKEN=x", ".env.local": "X=1", "config/.env.production": "X=1", "envrc.py": "x = 1\n",
                 "myenv/pyvenv.cfg": "home = /usr/bin\n", "myenv/lib/site.py": "x", "node_modules/a.js": "x",
                 "lib/__pycache__/m.cpython-311.pyc": "x"})
    _git(repo, "add", "-f", ".")
    assert list_files(app) == ["app.py", "envrc.py"]


def test_a_tracked_file_since_deleted_is_left_out(repo: Path) -> None:
    app = repo / "services" / "model"
    _write(app, {"old.py": "x = 1\n"})
    _git(repo, "add", ".")
    (app / "old.py").unlink()
    assert list_files(app) == ["app.py"]


def test_a_folder_git_ignores_whole_falls_back_to_its_own_listing(repo: Path) -> None:
    (repo / ".gitignore").write_text("scratch/\n")
    _write(repo, {"scratch/app.py": "x = 1\n", "scratch/.env": "X=1", "scratch/.gitignore": "*.bin\n",
                  "scratch/w.bin": "x"})
    assert list_files(repo / "scratch") == [".gitignore", "app.py"]


def test_outside_a_work_tree_a_virtual_environment_of_any_name_is_left_out(tmp_path: Path) -> None:
    _write(tmp_path, {"app.py": "x = 1\n", "tools/pyvenv.cfg": "home = /usr\n", "tools/bin/python": "x",
                      ".env.prod": "X=1"})
    assert list_files(tmp_path) == ["app.py"]


def test_the_listing_is_sorted_and_the_same_each_time(repo: Path) -> None:
    app = repo / "services" / "model"
    _write(app, {"b.py": "", "a/z.py": "", "A.py": "", "a.py": ""})
    _git(repo, "add", "services/model/b.py")
    assert list_files(app) == sorted(list_files(app)) == ["A.py", "a.py", "a/z.py", "app.py", "b.py"]
    assert build_bundle(app).sha256 == build_bundle(app).sha256


def test_the_watchers_poll_stays_cheap(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll (five a second) runs one ``git ls-files`` for the whole folder, not one per folder or file (its time
    is measured in bench/, not asserted here)."""
    app = repo / "services" / "model"
    _write(app, {f"pkg{i}/m{j}.py": "" for i in range(20) for j in range(25)})
    runs: list[list[str]] = []
    real_run = subprocess.run

    def counted(cmd: list[str], *args: object, **kwargs: object) -> object:
        runs.append(cmd)
        return real_run(cmd, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "run", counted)
    for _ in range(5):
        found = snapshot(app)
    assert len(found) == 501
    assert len(runs) == 5 and all(cmd[0] == "git" and "ls-files" in cmd for cmd in runs)


def test_git_missing_falls_back_to_the_walker(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = repo / "services" / "model"
    _write(app, {"server.pem": "KEY", ".env": "X=1"})
    monkeypatch.setenv("PATH", os.devnull)  # no git to run
    assert list_files(app) == ["app.py", "server.pem"]  # the parent's .gitignore is git's to read
