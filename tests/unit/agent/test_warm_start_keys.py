"""Warm starts' keys (``agent/warm_starts.py``): a start takes a warm start only where everything the warm start was
begun with is what the start would get, but for what is given at the take (its app's identity, credentials,
secrets); so two apps of one image and sandbox share one, and never one begun with other GPUs; a key is kept while
one of its apps runs and reports; and a warm start's bundle folder gets the version's files at the take, as links
that share the bundle cache's files."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ember.wire import StartPhases
from ember.wire.natscreds import CREDS_ENV
from ember_runtime import warm
from ember_runtime.agent import warm_starts
from ember_runtime.agent.adoption import Records
from ember_runtime.agent.numa import HostMemory
from ember_runtime.agent.sandbox import Confinement
from ember_runtime.agent.warm_starts import WarmError, WarmStarts, _fill, template_of
from ember_runtime.replica import warm as warm_process
from ember_runtime.warm import Identity

ENV = {"EMBER_DEVICE": "cpu", CREDS_ENV: "creds-of-replica-1", "OMP_NUM_THREADS": "2", "HF_HOME": "/cache"}
CONF = Confinement(memory_mb=512, secrets={"API_KEY": "s3cret"}, readonly=(Path("/envs/abc"),))


def test_what_differs_per_replica_is_not_in_the_key_nor_in_what_the_warm_start_gets():
    template = template_of("app-a", sys.executable, ENV, CONF)
    assert dict(template.key.env) == dict(template.env) == {"EMBER_DEVICE": "cpu", "HF_HOME": "/cache",
                                                            "OMP_NUM_THREADS": "2"}
    assert template.confinement.secrets == {}  # given at the take, never at the warm start's exec
    other_replica = template_of("app-a", sys.executable, {**ENV, CREDS_ENV: "creds-of-replica-2"},
                                dataclasses.replace(CONF, secrets={"API_KEY": "rotated"}))
    assert other_replica.key == template.key


def test_another_app_of_the_same_sandbox_is_the_same_key_and_anything_else_of_the_sandbox_another():
    key = template_of("app-a", sys.executable, ENV, CONF).key
    other_app = template_of("app-b", sys.executable, {**ENV, CREDS_ENV: "creds-of-b"},
                            dataclasses.replace(CONF, secrets={"B_KEY": "b's"}))
    assert other_app.key == key and other_app.app == "app-b"  # its identity and secrets come at the take
    others = [
        template_of("app-a", "/envs/other/bin/python", ENV, CONF),
        template_of("app-a", sys.executable, {**ENV, "HF_HOME": "/elsewhere"}, CONF),
        template_of("app-a", sys.executable, {**ENV, "OMP_NUM_THREADS": "1"}, CONF),  # pools sized at import
        template_of("app-a", sys.executable, ENV, dataclasses.replace(CONF, memory_mb=1024)),
        template_of("app-a", sys.executable, ENV, dataclasses.replace(CONF, block_network=True)),
        template_of("app-a", sys.executable, ENV, dataclasses.replace(CONF, mounts=((Path("/v"), "/data"),))),
        template_of("app-a", sys.executable, ENV, dataclasses.replace(CONF, readonly=())),
    ]
    assert all(t.key != key for t in others)


def test_a_replica_with_gpus_takes_only_a_warm_start_begun_with_the_same_ones():
    gpu0 = template_of("app-a", sys.executable, {**ENV, "CUDA_VISIBLE_DEVICES": "GPU-0"},
                       dataclasses.replace(CONF, devices=("/dev/nvidia0",)))
    again = template_of("app-a", sys.executable, {**ENV, "CUDA_VISIBLE_DEVICES": "GPU-0", CREDS_ENV: "another"},
                        dataclasses.replace(CONF, devices=("/dev/nvidia0",)))
    gpu1 = template_of("app-a", sys.executable, {**ENV, "CUDA_VISIBLE_DEVICES": "GPU-1"},
                       dataclasses.replace(CONF, devices=("/dev/nvidia1",)))
    assert gpu0.key == again.key != gpu1.key  # another replica on the same GPU: the same key
    assert gpu0.confinement.devices == ("/dev/nvidia0",) and dict(gpu0.env)["CUDA_VISIBLE_DEVICES"] == "GPU-0"
    assert gpu0.key != template_of("app-a", sys.executable, ENV, CONF).key  # nor a replica without GPUs


def test_the_bundle_goes_in_as_links_to_the_cached_files(tmp_path):
    cached = tmp_path / "bundles" / "abc"
    (cached / "pkg").mkdir(parents=True)
    (cached / "app.py").write_text("import pkg\n")
    (cached / "pkg" / "__init__.py").write_text("X = 1\n")
    into = tmp_path / "warm" / "bundle"
    into.mkdir(parents=True)
    _fill(cached, into)
    assert (into / "pkg" / "__init__.py").read_text() == "X = 1\n"
    assert (into / "app.py").stat().st_ino == (cached / "app.py").stat().st_ino


def test_a_warm_start_imports_only_the_libraries_it_knows():
    assert "this" not in sys.modules
    warm_process.preimport(["this", "json", "numpy"])  # a name a replica reported that is not one of MODULES: not
    assert "this" not in sys.modules
    assert "numpy" in sys.modules and "numpy" in warm.imported()


def test_two_keys_of_one_app_each_keep_a_warm_start_and_a_key_no_replica_reports_goes(tmp_path, monkeypatch):
    """Real warm-start processes (unsandboxed, numpy imported ahead): each key keeps its own, reporting again does
    not begin another, a take begins the next, and a key not reported within FORGET_S is let go of."""
    small = template_of("app-a", sys.executable, {"EMBER_DEVICE": "cpu"}, Confinement())
    large = template_of("app-a", sys.executable, {"EMBER_DEVICE": "cpu"}, Confinement(memory_mb=4096))
    assert small.key != large.key

    async def go() -> None:
        pool = WarmStarts(Records(tmp_path / "replicas"), limit=2)
        try:
            for _ in range(3):  # two services of one app, reporting in turn: no warm start replaces the other
                pool.want(small, ["numpy"])
                pool.want(large, ["numpy"])
            await _until(lambda: len(pool._held) == 2 and all(w.ready for w in pool._held.values()))
            first = dict(pool._held)
            pool.want(small, ["numpy"])
            pool.want(large, ["numpy"])
            assert pool._held == first and pool.statuses() == {"app-a": "ready"}
            other = template_of("app-b", sys.executable, {"EMBER_DEVICE": "cpu"}, Confinement(memory_mb=8192))
            pool.want(other, ["numpy"])  # a third key, over the limit: first come
            assert other.key not in pool._wanted and pool.statuses() == {"app-a": "ready"}
            taken = pool.take(small.key)
            assert taken is first[small.key] and pool.take(small.key) is None  # the next one is only beginning
            await _until(lambda: small.key in pool._held and pool._held[small.key] is not taken)
            monkeypatch.setattr(warm_starts, "FORGET_S", 0.0)
            pool.want(large, ["numpy"])
            await pool.keep({"app-a"})  # nothing reported since (FORGET_S 0): both let go of
            assert pool._held == {} and pool.statuses() == {}
            await asyncio.wait_for(first[large.key].proc.wait(), 10)  # its process ended with its pipe
            assert not first[large.key].folder.exists()
            await taken.stop()
        finally:
            await pool.stop()

    asyncio.run(go())


async def _until(condition, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_a_warm_start_that_ended_after_its_take_is_refused_and_leaves_nothing(tmp_path):
    template = template_of("app-a", sys.executable, {"EMBER_DEVICE": "cpu"}, Confinement())
    records = Records(tmp_path / "replicas")

    async def go() -> None:
        pool = WarmStarts(records, limit=1)
        try:
            pool.want(template, ["numpy"])
            await _until(lambda: template.key in pool._held)
            taken = pool.take(template.key)
            assert taken is not None
            folder = taken.folder
            os.killpg(taken.proc.pid, signal.SIGKILL)  # it dies between the take and the hand-over
            await asyncio.wait_for(taken.proc.wait(), 10)
            with pytest.raises(WarmError, match="ended"):
                await taken.give(records, "r-1", tmp_path, Identity(argv=[]))
            assert not folder.exists() and not (records.root / "r-1").exists()
        finally:
            await pool.stop()

    asyncio.run(go())


def test_two_apps_of_one_key_share_its_warm_start_which_stays_while_either_runs(tmp_path, monkeypatch):
    """Real warm-start processes: a second app of the key shares the first's warm start (none more begun; both see it
    in their status); a library only the second reported begins it again importing both; the key stays while either
    app runs and goes with the last."""
    env = {"EMBER_DEVICE": "cpu"}
    a, b = template_of("app-a", sys.executable, env, Confinement()), template_of("app-b", sys.executable, env,
                                                                                   Confinement())
    assert a.key == b.key

    async def go() -> None:
        pool = WarmStarts(Records(tmp_path / "replicas"), limit=1)
        try:
            pool.want(a, ["numpy"])
            await _until(lambda: a.key in pool._held and pool._held[a.key].ready)
            first = pool._held[a.key]
            pool.want(b, ["numpy"])  # the same key, nothing new to import: the same warm start
            assert pool._held[a.key] is first and pool.statuses() == {"app-a": "ready", "app-b": "ready"}
            pool.want(b, ["numpy", "json", "onnxruntime"])  # one more of MODULES: begun again, importing both
            await _until(lambda: a.key in pool._held and pool._held[a.key] is not first and pool._held[a.key].ready)
            assert pool._held[a.key].modules == ("numpy", "onnxruntime")
            await asyncio.wait_for(first.proc.wait(), 10)  # the one it replaced ended
            await pool.keep({"app-b"})  # app-a gone: app-b still asks, the key stays
            assert a.key in pool._held and pool.statuses() == {"app-b": "ready"}
            last = pool._held[a.key]
            await pool.keep(set())  # the last app gone: let go of
            assert pool._held == {} and pool.statuses() == {}
            await asyncio.wait_for(last.proc.wait(), 10)
        finally:
            await pool.stop()

    asyncio.run(go())


def test_a_node_short_of_memory_begins_no_warm_start_and_lets_go_of_those_it_holds(tmp_path):
    """Against this machine's own MemAvailable: a threshold above it begins none (however often asked) and lets go of
    the one held; a node whose replicas reserved its memory begins none either."""
    template = template_of("app-a", sys.executable, {"EMBER_DEVICE": "cpu"}, Confinement())
    available = warm_starts.available_mb()
    assert available is not None and available > 0  # /proc/meminfo read

    async def go() -> None:
        pool = WarmStarts(Records(tmp_path / "replicas"), limit=1, min_available_mb=available * 4)
        try:
            for _ in range(3):
                pool.want(template, ["numpy"])
                await asyncio.sleep(0.2)
            assert pool._held == {} and pool.statuses() == {} and "MB of memory available" in pool.short()
            pool.min_available_mb = 0
            pool.want(template, ["numpy"])
            await _until(lambda: template.key in pool._held)
            held = pool._held[template.key]
            pool.min_available_mb = available * 4
            await pool.keep({"app-a"})  # under half of the threshold now: let go of
            assert pool._held == {}
            await asyncio.wait_for(held.proc.wait(), 10)
        finally:
            await pool.stop()
        reserved = HostMemory(total_mb=4096)
        reserved.reserve("replica-1", 4096 - warm_starts.WARM_MB + 1)
        crowded = WarmStarts(Records(tmp_path / "replicas"), limit=1, host_memory=reserved, min_available_mb=0)
        assert "reserved" in crowded.short()
        reserved.release("replica-1")
        assert crowded.short() == ""

    asyncio.run(go())


def test_only_a_ready_replica_that_imported_heavy_libraries_and_does_not_fork_here_asks_for_one():
    def start(kind: str = "cold", modules: tuple[str, ...] = ("torch",)) -> StartPhases:
        return StartPhases(kind=kind, fetch_s=0, interpreter_s=0, imports_s=0, setup_s=0, ready_s=0,
                           modules=list(modules))

    assert warm_starts.asks("ready", start(), forks_here=False)
    assert warm_starts.asks("ready", start("warm"), forks_here=False)  # a taken one is replaced: asked again
    assert not warm_starts.asks("starting", start(), forks_here=False)
    assert not warm_starts.asks("ready", start(modules=()), forks_here=False)  # nothing heavy to import ahead
    assert not warm_starts.asks("ready", start("zygote"), forks_here=False)
    # a snap version's first replica started fresh while its zygote built here: its next starts fork, none asked
    assert not warm_starts.asks("ready", start("cold"), forks_here=True)


def test_a_replica_asks_for_what_its_app_imports_not_for_what_its_warm_start_had(tmp_path):
    """In a process of its own: onnxruntime and numpy imported first, as a warm start would; the app then imports
    numpy (already there) and json: it needs numpy, not onnxruntime. An import done some other way counts too."""
    script = tmp_path / "load.py"
    script.write_text(
        "import importlib, json, sys\n"
        "from ember_runtime import warm\n"
        "import onnxruntime, numpy  # the warm start's\n"
        "with warm.Asked() as asked:\n"
        "    import numpy.linalg  # the app's own: already imported, still asked\n"
        "    import json as _json\n"
        "print(json.dumps(asked.modules()))\n"
        "with warm.Asked() as other:\n"
        "    importlib.import_module('torch')  # not through an import statement\n"
        "print(json.dumps(other.modules()))\n"
        "print(__builtins__.__import__ is __import__ and __import__.__module__ == 'builtins')\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    first, second, restored = out.stdout.splitlines()
    assert json.loads(first) == ["numpy"]
    assert "torch" in json.loads(second) and "onnxruntime" not in json.loads(second)
    assert restored == "True"  # the watch is gone after the load


def test_a_warm_start_says_what_it_holds_and_an_ask_it_covers_does_not_begin_another(tmp_path):
    """A real warm start told torch holds numpy too (torch imports it): a replica that started cold and asks for
    both (its own import of torch imported numpy) takes nothing from it, and it is not begun again."""
    a = template_of("app-a", sys.executable, {"EMBER_DEVICE": "cpu"}, Confinement())

    async def go() -> None:
        pool = WarmStarts(Records(tmp_path / "replicas"), limit=1)
        try:
            pool.want(a, ["torch"])  # a replica begun warm asks for what its app's import statements named
            await _until(lambda: a.key in pool._held and pool._held[a.key].ready, timeout_s=120)
            held = pool._held[a.key]
            assert held.modules == ("numpy", "torch")
            pool.want(dataclasses.replace(a, app="app-b"), ["numpy", "torch"])
            await asyncio.sleep(0.5)
            assert pool._held[a.key] is held and a.key not in pool._starting
        finally:
            await pool.stop()

    asyncio.run(go())
