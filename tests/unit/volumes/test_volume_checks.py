"""Volumes' pure checks: names, mount paths, file paths inside a volume, a version's files; the SDK's decorator
argument and the files a put takes; the node's permissions over volumes; placement's preference for a node that
holds a replica's volumes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path

import msgspec
import pytest
from support.builders import deployment, service_spec
from support.placement import H100X2, node, req, snap

import ember
from ember._errors import InvalidInputError, InvalidSpecError
from ember._volume import chunks_of, local_files
from ember.wire import Manifest, VolumeFile, VolumeMount
from ember.wire.validate import manifest_problems
from ember.wire.volumes import file_problem, mount_problem, name_problem
from ember_platform.control.preloader import Preloader
from ember_platform.natsauth import permissions
from ember_platform.scheduler import Binding, place
from ember_platform.volumes.checks import check_files, unreferenced
from ember_runtime.agent import sandbox
from ember_runtime.agent.volumes import LocalChunk, LocalFile, LocalVersion, VolumeCache, bad_chunks

SHA = "a" * 64


@pytest.mark.parametrize("path", ["/weights", "/data/models", "/mnt/w-1.2_x", "/opt/weights", "/home/other"])
def test_mount_paths_that_are_fine(path: str) -> None:
    assert mount_problem(path) is None


@pytest.mark.parametrize("path", ["/", "/usr", "/usr/local/w", "/proc", "/proc/self", "/etc", "/sys/x", "/dev/shm",
                                  "/lib64", "/tmp", "/tmp/x", "/home", "/home/ember/w", "/bundle", "/bundle/w",
                                  "/var/run", "weights", "./w", "/w/", "/a//b", "/a/../b", "/a/./b", "/w x", "/w\n",
                                  "/" + "a" * 300, ""])
def test_mount_paths_over_or_under_the_system_or_not_normalised_are_refused(path: str) -> None:
    assert mount_problem(path) is not None


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/abs", "a//b", "./a", "a/.", "", "a\\b", "a\x00b", "a\nb",
                                  "/".join(["d"] * 40), "x" * 2000])
def test_file_paths_that_leave_the_volume_or_are_not_normalised_are_refused(path: str) -> None:
    assert file_problem(path) is not None


def test_file_paths_inside_a_volume() -> None:
    assert file_problem("model.pt") is None and file_problem("sub dir/a.b-c_d") is None


@pytest.mark.parametrize("name", ["Weights", "-w", "w_1", "a" * 64, "", "w.x", "../w"])
def test_bad_volume_names(name: str) -> None:
    assert name_problem(name) is not None
    with pytest.raises(InvalidSpecError):
        ember.Volume(name)


def test_the_decorator_takes_a_dict_of_mount_paths_to_volumes() -> None:
    app = ember.App("v")

    @app.function(volumes={"/w": ember.Volume("w"), "/x": ember.Volume("x", version=3)})
    def f() -> int:
        return 1

    assert app.services["f"].volumes == [VolumeMount(path="/w", name="w"), VolumeMount(path="/x", name="x", version=3)]
    nested = {"/w": ember.Volume("w"), "/w/x": ember.Volume("x")}
    for bad in ({"/w": "w"}, ["/w"], nested, {"/proc": ember.Volume("w")}):
        with pytest.raises(InvalidSpecError):
            app.function(volumes=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidSpecError):
        ember.Volume("w", version=0)


def test_the_platform_checks_mounts_in_a_manifest_again() -> None:
    mounts = [VolumeMount(path="/w", name="w"), VolumeMount(path="/w/inner", name="x"),
              VolumeMount(path="/usr", name="y"), VolumeMount(path="/z", name="Bad"), VolumeMount(path="/v", name="v",
                                                                                                   version=-1)]
    manifest = Manifest(app="a", module="a", services=[service_spec("s", volumes=mounts)])
    fields = [f for f, _ in manifest_problems(manifest)]
    assert fields == ["$.manifest.services[0].volumes[1].path", "$.manifest.services[0].volumes[2].path",
                      "$.manifest.services[0].volumes[3].name", "$.manifest.services[0].volumes[4].version"]


def test_a_versions_files_are_checked() -> None:
    ok = VolumeFile(path="a/b", size=10, chunks=[SHA])
    check_files([ok, VolumeFile(path="c", size=0, chunks=[])], 10)
    cases = [
        ([], "$.files"),
        ([ok, ok], "$.files[1].path"),
        ([VolumeFile(path="../x", size=1, chunks=[SHA])], "$.files[0].path"),
        ([VolumeFile(path="x", size=1, chunks=["../" + "a" * 61])], "$.files[0].chunks[0]"),
        ([VolumeFile(path="x", size=20, chunks=[SHA])], "$.files[0].size"),
        ([VolumeFile(path="x", size=0, chunks=[SHA])], "$.files[0].size"),
        ([VolumeFile(path="x", size=-1, chunks=[])], "$.files[0].size"),
        ([VolumeFile(path="a", size=1, chunks=[SHA]), ok], "$.files[1]"),
    ]
    for files, field in cases:
        with pytest.raises(InvalidInputError) as caught:
            check_files(files, 10)
        assert caught.value.field == field, files


def test_only_chunks_no_kept_version_uses_are_collected() -> None:
    kept = [[VolumeFile(path="a", size=1, chunks=["1", "2"])], [VolumeFile(path="b", size=1, chunks=["3"])]]
    assert unreferenced({"1", "4", "5"}, kept) == {"4", "5"}


def test_a_put_takes_files_under_their_names_and_folders_files_under_their_paths(tmp_path: Path) -> None:
    (tmp_path / "dir" / "sub").mkdir(parents=True)
    (tmp_path / "dir" / "sub" / "a.bin").write_bytes(b"a")
    (tmp_path / "dir" / "b.txt").write_bytes(b"bb")
    (tmp_path / "outside").write_bytes(b"secret")
    (tmp_path / "dir" / "link").symlink_to(tmp_path / "outside")  # a link out of the folder is not followed
    (tmp_path / "model.pt").write_bytes(b"m")
    found = local_files([tmp_path / "dir", tmp_path / "model.pt"])
    assert [(f.path, f.size) for f in found] == [("b.txt", 2), ("model.pt", 1), ("sub/a.bin", 1)]
    with pytest.raises(InvalidSpecError, match="two files"):
        local_files([tmp_path / "model.pt", tmp_path / "model.pt"])
    with pytest.raises(InvalidSpecError, match="no such"):
        local_files([tmp_path / "missing"])


def test_files_are_read_a_chunk_at_a_time(tmp_path: Path) -> None:
    data = os.urandom(25)
    (tmp_path / "f").write_bytes(data)
    chunks = list(chunks_of(tmp_path / "f", 10))
    assert [len(c) for _, c in chunks] == [10, 10, 5]
    assert [s for s, _ in chunks] == [hashlib.sha256(c).hexdigest() for _, c in chunks]


def _allowed(perms: dict, kind: str, subject: str) -> bool:  # type: ignore[type-arg]
    def match(pattern: str) -> bool:
        p, s = pattern.split("."), subject.split(".")
        for i, token in enumerate(p):
            if token == ">":
                return len(s) > i
            if i >= len(s) or (token != "*" and token != s[i]):
                return False
        return len(p) == len(s)

    return any(match(p) for p in perms[kind]["allow"])


def test_a_node_agent_reads_volumes_through_a_control_plane_and_never_writes_them() -> None:
    perms = permissions.node("n1", "_INBOX.n1")
    assert _allowed(perms, "pub", "ember.node.n1.fetch")  # a control plane checks what the node may read
    assert not _allowed(perms, "pub", "ember.node.n2.fetch")
    assert not _allowed(perms, "pub", "$JS.API.DIRECT.GET.KV_ember_volumes.$KV.ember_volumes.w.1")
    assert not _allowed(perms, "pub", "$JS.API.CONSUMER.CREATE.OBJ_ember_volume_chunks")
    assert not _allowed(perms, "pub", f"$JS.API.DIRECT.GET.OBJ_ember_volume_chunks.$O.ember_volume_chunks.C.{SHA}")
    assert not _allowed(perms, "pub", "$KV.ember_volumes.w.1")
    assert not _allowed(perms, "pub", f"$O.ember_volume_chunks.C.{SHA}")
    assert not _allowed(perms, "pub", "$JS.API.STREAM.PURGE.OBJ_ember_volume_chunks")
    assert not _allowed(perms, "pub", "$JS.API.STREAM.MSG.DELETE.OBJ_ember_volume_chunks")
    replica = permissions.replica("r1", "a", 1, [("f", False, None)])
    assert not _allowed(replica, "pub", "$JS.API.DIRECT.GET.KV_ember_volumes.$KV.ember_volumes.w.1")
    assert not _allowed(replica, "pub", "$JS.API.CONSUMER.CREATE.OBJ_ember_volume_chunks")


def test_placement_prefers_a_node_that_holds_the_replicas_volumes() -> None:
    holding = node("b", H100X2)
    holding = type(holding)(**{**{f: getattr(holding, f) for f in holding.__struct_fields__}, "volumes": ["w@v2"]})
    s = snap(node("a", H100X2), holding)
    chosen = place(s, [req("r", "10GB", volumes=("w@v2",))])[0]
    assert isinstance(chosen, Binding) and chosen.node_id == "b"
    other = place(s, [req("r", "10GB", volumes=("w@v1",))])[0]  # another version is not held
    assert isinstance(other, Binding) and other.node_id == "a"


def test_a_sandbox_binds_each_volume_read_only_at_its_mount_path(tmp_path: Path) -> None:
    jail = sandbox.Jail(bundle=tmp_path / "b", mounts=((tmp_path / "v" / "w@v1", "/weights"),))
    argv = sandbox.Sandbox("/opt/bwrap", sandbox.python_roots()).argv(["true"], jail)
    binds = [tuple(argv[i + 1:i + 3]) for i, a in enumerate(argv) if a == "--ro-bind"]
    assert (str(tmp_path / "v" / "w@v1"), "/weights") in binds
    assert not [a for i, a in enumerate(argv) if a == "--bind" and argv[i + 2] == "/weights"]
    assert argv.index("--tmpfs") < argv.index("/weights")  # after the sandbox's own folders: nothing hides it


def test_a_replica_learns_where_its_volumes_are() -> None:
    mounts = ((Path("/state/volumes/w@v1"), "/weights"),)
    assert json.loads(sandbox.volume_env(mounts, sandboxed=True)["EMBER_VOLUMES"]) == {"/weights": "/weights"}
    unsandboxed = sandbox.volume_env(mounts, sandboxed=False)
    assert json.loads(unsandboxed["EMBER_VOLUMES"]) == {"/weights": "/state/volumes/w@v1"}
    assert sandbox.volume_env((), sandboxed=True) == {}
    os.environ["EMBER_VOLUMES"] = unsandboxed["EMBER_VOLUMES"]
    try:
        assert ember.mounted("/weights") == "/state/volumes/w@v1" and ember.mounted("/other") == "/other"
    finally:
        del os.environ["EMBER_VOLUMES"]


def test_a_mount_over_the_nodes_python_is_refused_by_the_agent() -> None:
    python = (Path("/opt/py/venv"),)
    assert sandbox.mount_problems(((Path("/c"), "/opt/py"),), python)  # over it
    assert sandbox.mount_problems(((Path("/c"), "/opt/py/venv/lib"),), python)  # inside it
    assert not sandbox.mount_problems(((Path("/c"), "/weights"),), python)


def _cached(cache: VolumeCache, key: str, size: int, used_at: float) -> None:
    name, _, version = key.rpartition("@v")
    (cache.root / key).mkdir()
    (cache.root / key / "f").write_bytes(b"x" * size)
    local = LocalVersion(name=name, version=int(version),
                         files=[LocalFile(path="f", size=size, chunks=[LocalChunk("a" * 64, size)])])
    (cache.root / f"{key}.json").write_bytes(msgspec.json.encode(local))
    os.utime(cache.root / f"{key}.json", (used_at, used_at))


def test_the_node_cache_keeps_its_budget_and_never_removes_a_volume_in_use(tmp_path: Path) -> None:
    cache = VolumeCache(tmp_path / "volumes", source=None, budget_bytes=150)
    _cached(cache, "old@v1", 100, 1000.0)
    _cached(cache, "used@v1", 100, 500.0)  # the least recently used, but a replica mounts it
    _cached(cache, "new@v2", 10, 2000.0)
    assert asyncio.run(cache.evict({"used@v1"})) == ["old@v1"]
    assert cache.cached() == ["new@v2", "used@v1"] and not (cache.root / "old@v1.json").exists()
    assert asyncio.run(cache.evict({"used@v1"})) == []  # over budget still: what is in use stays


def testbad_chunks_are_found_by_their_hashes(tmp_path: Path) -> None:
    good, bad = os.urandom(10), os.urandom(10)
    (tmp_path / "f").write_bytes(good + bad)
    local = LocalVersion(name="v", version=1, files=[LocalFile(path="f", size=20, chunks=[
        LocalChunk(hashlib.sha256(good).hexdigest(), 10), LocalChunk(hashlib.sha256(b"other").hexdigest(), 10)])])
    assert [(path, offset) for path, offset, _ in bad_chunks(tmp_path, local)] == [("f", 10)]


def test_a_preloaded_zygote_mounts_its_versions_volumes() -> None:
    mounts = [VolumeMount(path="/weights", name="w", version=2)]
    dep = deployment(service_spec("s", snap=True, volumes=mounts))
    n1 = node("n1", H100X2)
    plan = Preloader(demand=lambda app, svc: 0.0).zygotes({}, {"n1": n1}, {"a": dep}, lambda: snap(n1), now=0.0)
    assert [z.volumes for z in plan["n1"]] == [mounts]
