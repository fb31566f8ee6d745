"""The node's bundle cache: fetched from the object store, verified by sha256, unpacked once."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ember._bundle import unpack_bundle


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
