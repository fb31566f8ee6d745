"""The node's environment cache with the real ``uv``, offline: wheels of a throwaway package in a local folder."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import msgspec
import pytest
from support.wheels import PACKAGE, write_sdist, write_wheel

from ember.wire.images import ImageSpec
from ember_runtime.agent.bundles import folder_size
from ember_runtime.agent.envs import READY, UV_CACHE, BuildError, EnvCache, unique_bytes


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    for version in ("1.0", "2.0"):
        write_wheel(folder, version=version)
    return folder


def image(wheels: Path, version: str) -> ImageSpec:
    return ImageSpec(packages=[f"{PACKAGE}=={version}"], find_links=[str(wheels)], no_index=True)


def run_in(env_python: Path, code: str) -> str:
    done = subprocess.run([str(env_python), "-c", code], capture_output=True, text=True, check=True,
                          env={"PATH": os.defpath})
    return done.stdout.strip()


def test_a_locked_image_is_built_once_and_runs_embers_runtime_beside_its_own_pins(tmp_path, wheels):
    cache = EnvCache(tmp_path / "envs", local_indexes=[wheels])

    async def go() -> tuple[ImageSpec, list]:
        locked = await cache.lock(image(wheels, "1.0"))
        envs = await asyncio.gather(*(cache.ensure(locked) for _ in range(4)))  # concurrent starts
        return locked, envs

    locked, envs = asyncio.run(go())
    assert f"{PACKAGE}==1.0" in locked.lock and "--hash=sha256:" in locked.lock and locked.python
    assert cache.builds == 1 and len({e.path for e in envs}) == 1  # one build for four starts
    env = envs[0]
    assert env.path.name == locked.sha256 and (env.path / READY).is_file()
    assert run_in(env.python, f"import {PACKAGE}; print({PACKAGE}.__version__)") == "1.0"
    # Ember's runtime is importable inside, after the app's own packages on sys.path
    out = run_in(env.python, "import sys, ember, ember_runtime.replica.process, msgspec, nats; "
                             "print(sys.path.index([p for p in sys.path if p.endswith('site-packages')][0]) "
                             "< sys.path.index([p for p in sys.path if '/runtime/' in p][0]))")
    assert out == "True"
    assert cache.cached() == [locked.sha256]
    asyncio.run(cache.ensure(locked))
    assert cache.builds == 1  # found ready: not built again


def test_a_missing_version_and_a_pin_against_embers_runtime_fail_the_lock_naming_them(tmp_path, wheels):
    cache = EnvCache(tmp_path / "envs", local_indexes=[wheels])
    with pytest.raises(BuildError, match=rf"(?s)cannot resolve {PACKAGE}.*{PACKAGE}==3\.0"):
        asyncio.run(cache.lock(image(wheels, "3.0")))
    clash = msgspec.structs.replace(image(wheels, "1.0"), packages=["msgspec<0.10"])
    with pytest.raises(BuildError, match="msgspec"):
        asyncio.run(cache.lock(clash))


def test_a_node_refuses_what_it_was_not_meant_to_build(tmp_path, wheels):
    cache = EnvCache(tmp_path / "envs", local_indexes=[wheels])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(BuildError, match="EMBER_IMAGE_LOCAL_INDEXES"):
        asyncio.run(cache.lock(msgspec.structs.replace(image(wheels, "1.0"), find_links=[str(elsewhere)])))
    with pytest.raises(BuildError, match="EMBER_IMAGE_LOCAL_INDEXES"):  # a link out of the allowed folder
        (wheels / "out").symlink_to(elsewhere) if not (wheels / "out").exists() else None
        asyncio.run(cache.lock(msgspec.structs.replace(image(wheels, "1.0"), find_links=[str(wheels / "out")])))
    locked = asyncio.run(cache.lock(image(wheels, "1.0")))
    for forged in (msgspec.structs.replace(locked, sha256="../../../tmp/x"),
                   msgspec.structs.replace(locked, sha256="0" * 64),
                   msgspec.structs.replace(locked, lock=locked.lock + "other==1\n"),
                   msgspec.structs.replace(locked, lock="", sha256="")):
        with pytest.raises(BuildError):
            asyncio.run(cache.ensure(forged))
    assert not (tmp_path / "tmp").exists() and cache.builds == 0


def test_an_unfinished_environment_is_built_again(tmp_path, wheels):
    cache = EnvCache(tmp_path / "envs", local_indexes=[wheels])
    locked = asyncio.run(cache.lock(image(wheels, "2.0")))
    half = cache.root / locked.sha256
    (half / "bin").mkdir(parents=True)  # a crash mid-build: no ready mark
    env = asyncio.run(cache.ensure(locked))
    assert cache.builds == 1 and run_in(env.python, f"import {PACKAGE}; print({PACKAGE}.__version__)") == "2.0"


def test_the_cache_is_collected_least_recently_used_first_never_what_is_in_use(tmp_path, wheels):
    cache = EnvCache(tmp_path / "envs", local_indexes=[wheels])

    async def build(version: str) -> str:
        return (await cache.ensure(await cache.lock(image(wheels, version)))).sha256

    one, two = asyncio.run(build("1.0")), asyncio.run(build("2.0"))
    old = time.time() - 3600
    os.utime(cache.root / one / READY, (old, old))  # one was used longest ago
    cache.budget = 1
    assert cache.collect(in_use={one}) == [two]  # over budget, but one is in use: the other goes
    assert cache.cached() == [one]
    assert cache.collect(in_use=set()) == [one] and cache.cached() == []
    cache.budget = 10**12
    asyncio.run(build("1.0"))
    assert cache.collect(in_use=set()) == []  # within budget: nothing goes


def test_uvs_cache_counts_against_the_budget_and_is_cleaned_without_breaking_an_environment(tmp_path, wheels):
    cache = EnvCache(tmp_path / "envs", local_indexes=[wheels])
    env = asyncio.run(cache.ensure(asyncio.run(cache.lock(image(wheels, "2.0")))))
    uv_cache = cache.root / UV_CACHE
    both = unique_bytes([uv_cache, env.path])
    assert both < folder_size(uv_cache) + folder_size(env.path)  # the environment's files are hard links: once
    assert asyncio.run(cache.collect_uv_cache()) is False  # within the (default) budget: kept
    cached_files = sum(len(files) for _, _, files in os.walk(uv_cache))
    cache.budget = unique_bytes([env.path]) + 4096  # the environment fits, not uv's cache beside it
    assert asyncio.run(cache.collect_uv_cache()) is True
    assert sum(len(files) for _, _, files in os.walk(uv_cache)) < cached_files
    assert unique_bytes([uv_cache, env.path]) < both
    assert run_in(env.python, f"import {PACKAGE}; print({PACKAGE}.__version__)") == "2.0"  # still whole
    again = asyncio.run(cache.ensure(asyncio.run(cache.lock(image(wheels, "1.0")))))  # a later build downloads again
    assert run_in(again.python, f"import {PACKAGE}; print({PACKAGE}.__version__)") == "1.0"


def test_a_node_that_never_built_anything_builds_a_lock_made_elsewhere(tmp_path, wheels):
    locked = asyncio.run(EnvCache(tmp_path / "builder", local_indexes=[wheels]).lock(image(wheels, "2.0")))
    fresh = EnvCache(tmp_path / "another-node" / "envs", local_indexes=[wheels])  # no folder yet
    env = asyncio.run(fresh.ensure(locked))
    assert env.sha256 == locked.sha256 and fresh.builds == 1
    assert run_in(env.python, f"import {PACKAGE}; print({PACKAGE}.__version__)") == "2.0"


def test_a_source_distribution_is_never_built_on_the_node(tmp_path, wheels):
    marker = tmp_path / "ran"
    write_sdist(wheels, "emberbuild", "1.0", marker)
    cache = EnvCache(tmp_path / "envs", local_indexes=[wheels])
    sdist_only = msgspec.structs.replace(image(wheels, "1.0"), packages=["emberbuild==1.0"])
    with pytest.raises(BuildError, match="emberbuild"):
        asyncio.run(cache.lock(sdist_only))
    assert not marker.exists()  # its setup.py never ran


def test_two_locks_at_once_on_a_node_each_keep_their_constraints(tmp_path, wheels):
    """Two builds lock at once on a node (the suite met it): each lock's constraints file is its own, so the first
    to finish cannot remove the other's while its uv still reads it (one file per process was, and failed the
    second with uv's 'File not found')."""
    cache = EnvCache(tmp_path / "envs", local_indexes=[wheels])
    uv = cache._uv
    seen: list[Path] = []

    async def slowed(argv: list[str], **kwargs):  # the first lock's uv ends while the second's still runs
        constraints = Path(argv[argv.index("-c") + 1])
        seen.append(constraints)
        await asyncio.sleep(0.5 if len(seen) == 2 else 0.0)
        assert constraints.is_file(), f"{constraints.name} was removed under its lock"
        return await uv(argv, **kwargs)

    cache._uv = slowed  # type: ignore[method-assign]

    async def both() -> list[ImageSpec]:
        return list(await asyncio.gather(cache.lock(image(wheels, "1.0")), cache.lock(image(wheels, "2.0"))))

    first, second = asyncio.run(both())
    assert first.sha256 != second.sha256 and len({*seen}) == 2
    assert not [p for p in cache.root.iterdir() if p.name.startswith(".constraints-")]  # each removed after


def test_a_package_cannot_replace_the_files_the_agent_trusts_in_its_environment(tmp_path):
    """A wheel's data files land at the environment's root: one named pyvenv.cfg, whose ``home`` names a folder of
    the tenant's, made the node's bytecode compile (outside any sandbox) load that folder's standard library, and
    every sandbox of the image bind the folder; one named like the agent's ready mark or build log was written
    through, into uv's cache."""
    wheels, elsewhere = tmp_path / "wheels", tmp_path / "tenant" / "bin"
    data = "sneaky-1.0.data/data"
    write_wheel(wheels, name="sneaky", extra={f"{data}/pyvenv.cfg": f"home = {elsewhere}\ninclude-system-site-"
                                              "packages = true\n", f"{data}/{READY}": '{"home": "/"}\n'})
    cache = EnvCache(tmp_path / "envs", local_indexes=[wheels])
    env = asyncio.run(cache.ensure(asyncio.run(cache.lock(ImageSpec(packages=["sneaky==1.0"],
                                                                    find_links=[str(wheels)], no_index=True)))))
    cfg = (env.path / "pyvenv.cfg").read_text()
    assert str(elsewhere) not in cfg and "include-system-site-packages = false" in cfg
    assert not any(path.is_relative_to(tmp_path / "tenant") or path == Path("/") for path in env.readonly)
    assert run_in(env.python, "import sneaky, sys; print(sneaky.__version__, sys.prefix != sys.base_prefix)") \
        == "1.0 True"
