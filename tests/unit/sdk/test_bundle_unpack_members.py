"""A node unpacks only what ``check_bundle`` would let through: plain files and folders at paths inside the bundle.

Before, ``unpack_bundle`` relied on tarfile's data filter alone, which this Python (3.11.7) lets a chain of symlinks
lead out of the destination (CVE-2025-4517): a crafted bundle wrote a file outside the node's bundle cache. The
gateway refuses links, but the node unpacks what it fetched, whoever stored it."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from ember._bundle import unpack_bundle


def _escaping_archive() -> bytes:
    """Symlinks whose resolved path exceeds PATH_MAX: the data filter checks a path that is not where they lead."""
    comp, steps = "d" * 247, "abcdefghijklmnop"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        path = ""
        for step in steps:
            folder = tarfile.TarInfo(os.path.join(path, comp))
            folder.type = tarfile.DIRTYPE
            tar.addfile(folder)
            link = tarfile.TarInfo(os.path.join(path, step))
            link.type, link.linkname = tarfile.SYMTYPE, comp
            tar.addfile(link)
            path = os.path.join(path, comp)
        deep = os.path.join(*steps, "l" * 254)
        up = tarfile.TarInfo(deep)
        up.type, up.linkname = tarfile.SYMTYPE, os.path.join(*[".."] * len(steps))
        tar.addfile(up)
        escape = tarfile.TarInfo("escape")
        escape.type, escape.linkname = tarfile.SYMTYPE, deep + "/../../outside"
        tar.addfile(escape)
        data = b"written by a tenant's bundle\n"
        pwned = tarfile.TarInfo("escape/pwned.txt")
        pwned.size = len(data)
        tar.addfile(pwned, io.BytesIO(data))
    return buf.getvalue()


def _archive(*members: tarfile.TarInfo) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.addfile(_file("app.py", b"x = 1\n"), io.BytesIO(b"x = 1\n"))
        for member in members:
            tar.addfile(member)
    return buf.getvalue()


def _file(name: str, data: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info


def _special(name: str, kind: bytes, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def test_a_symlink_chain_out_of_the_destination_writes_nothing_anywhere(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "cache" / "sha"
    dest.mkdir(parents=True)
    with pytest.raises(tarfile.FilterError, match="only files and folders"):
        unpack_bundle(_escaping_archive(), dest)
    assert list(outside.iterdir()) == [] and list(dest.iterdir()) == []


@pytest.mark.parametrize("member", [
    _special("inside-link", tarfile.SYMTYPE, "app.py"),
    _special("hard", tarfile.LNKTYPE, "app.py"),
    _special("dev", tarfile.CHRTYPE),
    _special("fifo", tarfile.FIFOTYPE),
], ids=["symlink-inside", "hardlink-inside", "device", "fifo"])
def test_no_link_or_special_member_is_extracted_and_nothing_before_it_either(member: tarfile.TarInfo,
                                                                              tmp_path: Path) -> None:
    dest = tmp_path / "out"
    with pytest.raises(tarfile.FilterError):
        unpack_bundle(_archive(member), dest)
    assert not dest.exists() or list(dest.iterdir()) == []


def test_a_file_named_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(tarfile.FilterError, match="twice"):
        unpack_bundle(_archive(_file("app.py", b"")), tmp_path / "out")


def test_plain_files_and_folders_unpack(tmp_path: Path) -> None:
    folder = _special("lib", tarfile.DIRTYPE)
    unpack_bundle(_archive(folder), tmp_path / "out")
    assert (tmp_path / "out" / "app.py").read_bytes() == b"x = 1\n" and (tmp_path / "out" / "lib").is_dir()
