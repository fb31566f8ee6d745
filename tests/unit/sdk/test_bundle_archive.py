"""Bundles are deterministic, content-addressed archives of an app's folder, unpacked safely."""

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from ember._bundle import BundleTooLargeError, build_bundle, check_bundle, list_files, unpack_bundle
from ember._errors import InvalidSpecError


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    root = tmp_path / "app"
    _write(root, {
        "app.py": "import ember\napp = ember.App('demo')\n",
        "lib/util.py": "X = 1\n",
        "lib/data.json": '{"k": 1}\n',
    })
    return root


def test_build_is_deterministic(app_dir: Path) -> None:
    first, second = build_bundle(app_dir), build_bundle(app_dir)
    assert first.data == second.data
    assert first.sha256 == second.sha256


def test_build_ignores_mtimes(app_dir: Path) -> None:
    before = build_bundle(app_dir)
    for path in app_dir.rglob("*"):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    assert build_bundle(app_dir).data == before.data


def test_build_does_not_depend_on_the_folder_name(app_dir: Path, tmp_path: Path) -> None:
    moved = app_dir.rename(tmp_path / "elsewhere")
    other = tmp_path / "fresh"
    _write(other, {rel: (moved / rel).read_text() for rel in list_files(moved)})
    assert build_bundle(moved).sha256 == build_bundle(other).sha256


def test_sha256_is_the_hash_of_the_bytes(app_dir: Path) -> None:
    bundle = build_bundle(app_dir)
    assert bundle.sha256 == hashlib.sha256(bundle.data).hexdigest()
    assert bundle.sha256[:12] in repr(bundle)


def test_content_change_changes_the_hash(app_dir: Path) -> None:
    before = build_bundle(app_dir).sha256
    (app_dir / "lib/util.py").write_text("X = 2\n")
    assert build_bundle(app_dir).sha256 != before


def test_new_file_changes_the_hash(app_dir: Path) -> None:
    before = build_bundle(app_dir).sha256
    (app_dir / "empty.txt").write_text("")
    assert build_bundle(app_dir).sha256 != before


def test_mode_change_changes_the_hash(app_dir: Path) -> None:
    before = build_bundle(app_dir).sha256
    (app_dir / "app.py").chmod(0o755)
    assert build_bundle(app_dir).sha256 != before


def test_members_are_sorted_and_normalised(app_dir: Path) -> None:
    bundle = build_bundle(app_dir)
    assert bundle.files == ["app.py", "lib/data.json", "lib/util.py"]
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == bundle.files
    assert all((m.mtime, m.uid, m.gid, m.mode) == (0, 0, 0, 0o644) for m in members)


def test_caches_and_vcs_are_left_out(app_dir: Path) -> None:
    _write(app_dir, {
        "__pycache__/app.cpython-311.pyc": "x",
        "__pycache__/notes.txt": "x",
        "lib/__pycache__/util.cpython-311.pyc": "x",
        "stray.pyc": "x",
        "lib/stray.pyo": "x",
        ".git/HEAD": "ref: refs/heads/main\n",
        "lib/.git/config": "x",
        ".venv/bin/python": "x",
        ".DS_Store": "x",
    })
    assert build_bundle(app_dir).files == ["app.py", "lib/data.json", "lib/util.py"]


def test_gitignored_files_are_left_out(app_dir: Path) -> None:
    _write(app_dir, {
        ".gitignore": "# weights come from storage\n*.pt\n\nsecrets/\n!keep.pt\nlib/*.json\n",
        "weights.pt": "x",
        "lib/more.pt": "x",
        "keep.pt": "x",
        "secrets/token": "x",
        "lib/secrets/token": "x",
    })
    assert build_bundle(app_dir).files == [".gitignore", "app.py", "keep.pt", "lib/util.py"]


def test_gitignore_dir_pattern_keeps_files_of_that_name(app_dir: Path) -> None:
    _write(app_dir, {".gitignore": "build/\n", "build": "a file, not a folder", "sub/build/out.txt": "x"})
    assert list_files(app_dir) == [".gitignore", "app.py", "build", "lib/data.json", "lib/util.py"]


def test_gitignore_anchored_pattern_only_matches_at_the_root(app_dir: Path) -> None:
    _write(app_dir, {".gitignore": "/config.py\n", "config.py": "x", "lib/config.py": "x"})
    assert "lib/config.py" in list_files(app_dir)


def test_gitignore_double_star_matches_at_the_root(app_dir: Path) -> None:
    _write(app_dir, {".gitignore": "**/cache.bin\n", "cache.bin": "x", "lib/cache.bin": "x"})
    assert not any(f.endswith("cache.bin") for f in list_files(app_dir))


def test_unpack_roundtrip(app_dir: Path, tmp_path: Path) -> None:
    (app_dir / "run.sh").write_text("#!/bin/sh\n")
    (app_dir / "run.sh").chmod(0o755)
    bundle = build_bundle(app_dir)
    dest = tmp_path / "out"
    unpack_bundle(bundle.data, dest)
    unpacked = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert unpacked == bundle.files
    for rel in bundle.files:
        assert (dest / rel).read_bytes() == (app_dir / rel).read_bytes()
    assert os.access(dest / "run.sh", os.X_OK)
    assert build_bundle(dest).sha256 == bundle.sha256


def _archive(member: tarfile.TarInfo, content: bytes = b"") -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        member.size = len(content)
        tar.addfile(member, io.BytesIO(content))
    return raw.getvalue()


def _symlink(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


@pytest.mark.parametrize("member", [
    tarfile.TarInfo("../escape.txt"),
    tarfile.TarInfo("lib/../../escape.txt"),
    _symlink("link", "/etc/passwd"),
    _symlink("link", "../escape.txt"),
], ids=["parent", "nested-parent", "absolute-link", "escaping-link"])
def test_unpack_refuses_paths_out_of_the_destination(member: tarfile.TarInfo, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    with pytest.raises(tarfile.FilterError):
        unpack_bundle(_archive(member, b"pwned"), dest)
    assert not (tmp_path / "escape.txt").exists()
    assert not (dest / "link").exists()


def test_unpack_keeps_absolute_names_inside(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    unpack_bundle(_archive(tarfile.TarInfo("/abs.txt"), b"hi"), dest)
    assert (dest / "abs.txt").read_bytes() == b"hi"


def _hardlink(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.LNKTYPE, target
    return info


def _device(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.CHRTYPE
    return info


def test_a_built_bundle_passes_the_upload_check(app_dir: Path) -> None:
    bundle = build_bundle(app_dir)
    assert check_bundle(bundle.data) == sum((app_dir / rel).stat().st_size for rel in bundle.files)


@pytest.mark.parametrize("member", [
    tarfile.TarInfo("../escape.txt"),
    tarfile.TarInfo("lib/../../escape.txt"),
    tarfile.TarInfo("/abs.txt"),
    tarfile.TarInfo("a//b.txt"),
    tarfile.TarInfo("a\\b.txt"),
    tarfile.TarInfo("x" * 2000),
    _symlink("link", "/etc/passwd"),
    _symlink("link", "../escape.txt"),
    _hardlink("hard", "/etc/passwd"),
    _hardlink("hard", "../escape.txt"),
    _device("dev"),
], ids=["parent", "nested-parent", "absolute", "empty-part", "backslash", "long", "absolute-link", "escaping-link",
        "absolute-hardlink", "escaping-hardlink", "device"])
def test_the_upload_check_refuses_anything_but_files_and_folders_inside(member: tarfile.TarInfo) -> None:
    with pytest.raises(InvalidSpecError, match="bundle member"):
        check_bundle(_archive(member, b"pwned"))


def test_the_upload_check_refuses_a_bomb_by_its_declared_sizes_before_inflating_it() -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for i in range(3):
            info = tarfile.TarInfo(f"zeros{i}")
            info.size = 1 << 20
            tar.addfile(info, io.BytesIO(bytes(info.size)))
    data = raw.getvalue()
    assert len(data) < 20_000  # 3 MiB of zeros
    with pytest.raises(BundleTooLargeError, match="unpacks to more than"):
        check_bundle(data, max_unpacked_bytes=2 << 20)
    assert check_bundle(data, max_unpacked_bytes=3 << 20) == 3 << 20
    with pytest.raises(BundleTooLargeError, match="more than 2 members"):
        check_bundle(data, max_files=2)


def test_the_upload_check_refuses_what_is_not_a_gzipped_tar() -> None:
    for data in (b"", b"not an archive", gzip.compress(b"not a tar")):
        with pytest.raises(InvalidSpecError, match="gzip'd tar"):
            check_bundle(data)
    with pytest.raises(InvalidSpecError, match="appears twice"):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for _ in range(2):
                info = tarfile.TarInfo("same.txt")
                tar.addfile(info, io.BytesIO(b""))
        check_bundle(raw.getvalue())
