"""The node's bundle cache stays within its budget: least recently used first, never what is in use."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from ember_runtime.agent.bundles import BundleCache, CachedBundle, budget_from_env, choose_evictions


def _b(sha: str, size: int, used: float) -> CachedBundle:
    return CachedBundle(sha256=sha, size=size, last_used=used)


def test_within_budget_nothing_goes() -> None:
    assert choose_evictions([_b("a", 10, 1), _b("b", 10, 2)], set(), budget=20) == []


def test_least_recently_used_go_first_until_within_budget() -> None:
    cached = [_b("new", 10, 30), _b("old", 10, 10), _b("mid", 10, 20)]
    assert choose_evictions(cached, set(), budget=15) == ["old", "mid"]
    assert choose_evictions(cached, set(), budget=20) == ["old"]


def test_in_use_is_never_evicted_even_over_budget() -> None:
    cached = [_b("old", 100, 1), _b("new", 10, 2)]
    assert choose_evictions(cached, {"old"}, budget=50) == ["new"]
    assert choose_evictions(cached, {"old", "new"}, budget=0) == []


def test_budget_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_NODE_BUNDLE_CACHE_BYTES", raising=False)
    assert budget_from_env() == 20 * 1024**3
    monkeypatch.setenv("EMBER_NODE_BUNDLE_CACHE_BYTES", "1234")
    assert budget_from_env() == 1234
    monkeypatch.setenv("EMBER_NODE_BUNDLE_CACHE_BYTES", "lots")
    with pytest.raises(ValueError, match="EMBER_NODE_BUNDLE_CACHE_BYTES"):
        budget_from_env()


def _unpacked(root: Path, sha: str, size: int, mtime: float) -> None:
    (root / sha).mkdir(parents=True)
    (root / sha / "weights.bin").write_bytes(b"x" * size)
    os.utime(root / sha, (mtime, mtime))


def test_evict_removes_folders_by_last_use_and_keeps_in_use(tmp_path: Path) -> None:
    root = tmp_path / "bundles"
    _unpacked(root, "a" * 64, 1000, 100.0)
    _unpacked(root, "b" * 64, 1000, 200.0)
    _unpacked(root, "c" * 64, 1000, 300.0)
    (root / ".a-partial").mkdir()  # a crash's leftover
    cache = BundleCache(root, store=None, budget_bytes=1500)
    assert not (root / ".a-partial").exists()
    removed = asyncio.run(cache.evict({"a" * 64}))
    assert removed == ["b" * 64, "c" * 64]
    assert cache.cached() == ["a" * 64]
    assert [p.name for p in root.iterdir()] == ["a" * 64]


def test_get_marks_a_use(tmp_path: Path) -> None:
    root = tmp_path / "bundles"
    _unpacked(root, "a" * 64, 1000, 100.0)
    _unpacked(root, "b" * 64, 1000, 200.0)
    cache = BundleCache(root, store=None, budget_bytes=1000)
    asyncio.run(cache.get("a" * 64))  # cached: no fetch; now the most recent
    assert asyncio.run(cache.evict(set())) == ["b" * 64]
