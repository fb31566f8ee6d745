"""The node's bundle cache (the artifact cache): fetched from the object store, verified by sha256,
unpacked once, its weight files read ahead into the page cache, so that a replica starts from local disk."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ember._bundle import unpack_bundle

WEIGHT_SUFFIXES = frozenset({".pt", ".pth", ".bin", ".safetensors", ".onnx", ".engine", ".plan", ".npz", ".npy"})


class BundleCache:
    def __init__(self, root: Path, store: Any) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._store = store
        self._locks: dict[str, asyncio.Lock] = {}

    def cached(self) -> list[str]:
        """The bundles unpacked here (placement prefers nodes that hold a function's bundle)."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def has(self, sha256: str) -> bool:
        return (self.root / sha256).is_dir()

    async def get(self, sha256: str) -> Path:
        """The unpacked folder of bundle ``sha256``, fetching and verifying it on first use."""
        dest = self.root / sha256
        if dest.is_dir():
            return dest
        async with self._locks.setdefault(sha256, asyncio.Lock()):
            if dest.is_dir():
                return dest
            result = await self._store.get(sha256)
            data = result.data or b""
            digest = hashlib.sha256(data).hexdigest()
            if digest != sha256:
                raise ValueError(f"bundle {sha256} failed verification: its content hashes to {digest}")
            await asyncio.to_thread(self._unpack, data, dest)
        return dest

    def _unpack(self, data: bytes, dest: Path) -> None:
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name[:12]}-", dir=self.root))
        try:
            unpack_bundle(data, tmp)
            tmp.rename(dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        read_ahead(dest)


def read_ahead(folder: Path) -> int:
    """Ask the kernel to bring the folder's weight files into the page cache; returns how many it asked for."""
    count = 0
    for path in folder.rglob("*"):
        if path.suffix in WEIGHT_SUFFIXES and path.is_file():
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                    count += 1
            finally:
                os.close(fd)
    return count
