"""Links in an app's folder: one to a file inside it is bundled (its content), one whose target resolves outside
it (``link -> ~/.aws/credentials``) never is, and the push says which were left out."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

import ember
from ember._bundle import build_bundle, list_files
from ember._client import Transport
from ember._errors import EmberError


@pytest.fixture
def app(tmp_path: Path) -> Path:
    root = tmp_path / "app"
    (root / "lib").mkdir(parents=True)
    (root / "app.py").write_text("import ember\n\napp = ember.App('links')\n\n\n@app.function()\n"
                                 "def f() -> int:\n    return 1\n")
    (root / "lib" / "config.json").write_text("{}")
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "credentials").write_text("AWS_SECRET=abc\n")
    (outside / "dir" / "key.pem").write_text("KEY\n")
    (root / "creds").symlink_to(outside / "credentials")
    (root / "relative").symlink_to(Path("..") / "outside" / "credentials")
    (root / "linked_dir").symlink_to(outside / "dir")
    (root / "config.json").symlink_to(Path("lib") / "config.json")  # inside: bundled
    return root


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def test_a_link_to_a_file_outside_the_folder_is_left_out_and_named(app: Path) -> None:
    bundle = build_bundle(app)
    assert bundle.files == ["app.py", "config.json", "lib/config.json"]
    assert bundle.skipped == ["creds", "relative"]
    members = _members(bundle.data)
    assert members["config.json"] == b"{}"
    assert not any(b"AWS_SECRET" in content or b"KEY" in content for content in members.values())


def test_in_a_git_work_tree_too(app: Path) -> None:
    subprocess.run(["git", "-C", str(app), "init", "-q", "."], check=True)
    subprocess.run(["git", "-C", str(app), "add", "."], check=True)
    assert list_files(app) == ["app.py", "config.json", "lib/config.json"]
    assert build_bundle(app).skipped == ["creds", "relative"]


def test_a_tracked_folder_replaced_by_a_link_out_of_the_app_is_left_out(app: Path, tmp_path: Path) -> None:
    subprocess.run(["git", "-C", str(app), "init", "-q", "."], check=True)
    (app / "keys").mkdir()
    (app / "keys" / "key.pem").write_text("mine\n")
    subprocess.run(["git", "-C", str(app), "add", "keys"], check=True)
    (app / "keys" / "key.pem").unlink()
    (app / "keys").rmdir()
    (app / "keys").symlink_to(tmp_path / "outside" / "dir")
    assert "keys/key.pem" in build_bundle(app).skipped


def test_push_says_which_links_it_left_out(app: Path) -> None:
    said: list[str] = []
    with pytest.raises(EmberError):  # nothing listens there: the push stops at the upload, after packing
        ember.deploy(app / "app.py", transport=Transport("http://127.0.0.1:9", token=""),
                     progress=lambda message, _view: said.append(message))
    assert "left out 2 link(s) to files outside app/: creds, relative" in said
