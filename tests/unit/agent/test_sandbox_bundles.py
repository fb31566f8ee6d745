"""The bundle cache is written only by the agent: an unpacked bundle is read-only, and what it holds is
recorded at unpack so that a change is seen before the next start."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from ember._bundle import build_bundle
from ember_runtime.agent.bundles import TREE_FORMAT, BundleCache, make_read_only, remove_tree, tree_digest
from ember_runtime.agent.warm_starts import _fill


@pytest.fixture
def unpacked(tmp_path: Path):
    app = tmp_path / "app"
    (app / "pkg").mkdir(parents=True)
    (app / "app.py").write_text("import ember\n")
    (app / "pkg" / "weights.bin").write_bytes(b"w" * 100)
    cache = BundleCache(tmp_path / "bundles", store=None)
    bundle = build_bundle(app)
    sha256 = bundle.sha256
    cache._unpack(bundle.data, cache.root / sha256)
    yield cache, sha256
    remove_tree(cache.root)


def test_an_unpacked_bundle_cannot_be_written(unpacked) -> None:
    cache, sha256 = unpacked
    folder = cache.root / sha256
    for path in (folder, folder / "pkg", folder / "app.py", folder / "pkg" / "weights.bin"):
        assert not os.stat(path).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), path
    if os.geteuid() != 0:  # root writes whatever the mode says: the sandbox's read-only mount stops it there
        with pytest.raises(PermissionError):
            (folder / "app.py").write_text("changed")


def test_a_bundle_as_unpacked_passes_its_check_without_a_fetch(unpacked) -> None:
    cache, sha256 = unpacked
    assert asyncio.run(cache.verify(sha256)) == cache.root / sha256  # the store (None here) is not asked


@pytest.mark.parametrize("change", ["write", "chmod", "new file", "rename", "remove"])
def test_any_change_to_an_unpacked_bundle_changes_its_record(unpacked, change: str) -> None:
    cache, sha256 = unpacked
    folder = cache.root / sha256
    before = tree_digest(folder)
    os.chmod(folder, 0o755)
    os.chmod(folder / "pkg", 0o755)
    target = folder / "pkg" / "weights.bin"
    if change == "write":
        os.chmod(target, 0o644)
        target.write_bytes(b"W" * 100)  # same size
        os.chmod(target, 0o444)
    elif change == "chmod":
        os.chmod(target, 0o755)
    elif change == "new file":
        (folder / "sitecustomize.py").write_text("import os\n")
    elif change == "rename":
        target.rename(folder / "pkg" / "weights.pt")
    else:
        target.unlink()
    os.chmod(folder / "pkg", 0o555)
    os.chmod(folder, 0o555)
    assert tree_digest(folder) != before


def test_a_warm_starts_links_of_a_bundle_leave_it_as_it_was(unpacked, tmp_path: Path) -> None:
    """A warm start's replica gets the bundle as hard links of the cached one (``_fill``): each link changed its file's
    change time, the next check read the bundle as changed, and it was unpacked again, its folder taken away from
    under the replicas that had it as ``/bundle`` (the store, None here, would be asked)."""
    cache, sha256 = unpacked
    _fill(cache.root / sha256, tmp_path / "replica" / "bundle")
    assert os.stat(cache.root / sha256 / "app.py").st_nlink == 2  # linked, not copied
    assert asyncio.run(cache.verify(sha256)) == cache.root / sha256


def test_an_older_agents_record_is_read_as_it_was_made_and_made_again(unpacked) -> None:
    cache, sha256 = unpacked
    folder, record = cache.root / sha256, cache.root / f"{sha256}.tree"
    record.write_text(tree_digest(folder, change_times=True))  # as the agent before recorded it
    assert asyncio.run(cache.verify(sha256)) == folder
    assert record.read_text() == tree_digest(folder) and record.read_text().startswith(TREE_FORMAT)


def test_reading_and_marking_a_use_leave_the_record_alone(unpacked) -> None:
    cache, sha256 = unpacked
    folder = cache.root / sha256
    before = tree_digest(folder)
    (folder / "pkg" / "weights.bin").read_bytes()
    os.utime(folder)  # what the cache does to mark a use
    assert tree_digest(folder) == before


def test_a_read_only_bundle_is_still_removed(tmp_path: Path) -> None:
    folder = tmp_path / "b"
    (folder / "deep" / "er").mkdir(parents=True)
    (folder / "deep" / "er" / "f").write_text("x")
    make_read_only(folder)
    remove_tree(folder)
    assert not folder.exists()
