"""A folder past a bundle's limits (``MAX_UNPACKED_BYTES`` of files, ``MAX_FILES`` of them) is refused before
anything is gzipped in memory, the error naming the limit and where the bulk is."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember._bundle import MAX_FILES, MAX_UNPACKED_BYTES, BundleTooLargeError, build_bundle


def _sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that takes no disk (zeros, never written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.truncate(size)


def test_files_over_the_unpacked_limit_are_refused_naming_the_largest(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("import ember\n")
    _sparse(tmp_path / "weights" / "model.bin", MAX_UNPACKED_BYTES - (1 << 20))
    _sparse(tmp_path / "weights" / "extra.bin", 3 << 20)
    with pytest.raises(BundleTooLargeError) as caught:
        build_bundle(tmp_path)
    message = str(caught.value)
    assert f"over the {MAX_UNPACKED_BYTES >> 20} MiB limit" in message
    assert "weights/model.bin (511 MiB), weights/extra.bin (3 MiB), app.py" in message
    assert ".gitignore" in message


def test_files_up_to_the_limit_are_bundled(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("import ember\n")
    _sparse(tmp_path / "data.bin", 4 << 20)
    assert build_bundle(tmp_path).files == ["app.py", "data.bin"]


def test_more_files_than_a_bundle_holds_are_refused_naming_the_folder(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("import ember\n")
    samples = tmp_path / "samples"
    samples.mkdir()
    for i in range(MAX_FILES):
        (samples / f"{i}.txt").touch()
    with pytest.raises(BundleTooLargeError) as caught:
        build_bundle(tmp_path)
    assert f"{MAX_FILES + 1} files to bundle, over the limit of {MAX_FILES}" in str(caught.value)
    assert "samples/ (10000)" in str(caught.value)
