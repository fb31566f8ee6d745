"""What a sandbox is made of, without starting one: bwrap's command line, the environment's allow-list, the GPU
device nodes, the exit codes bwrap passes on, and whether replicas get memory limits on a node."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from support.paths import REPO

import ember
import ember_runtime
from ember.wire import Device
from ember_runtime.agent import devices, sandbox
from ember_runtime.agent.cgroups import decide
from ember_runtime.agent.devices import gpu_devices
from ember_runtime.agent.sandbox import (
    BUNDLE,
    HOME,
    Jail,
    Sandbox,
    environment,
    exit_code,
    writable_folders,
)

BWRAP = "/opt/bwrap"


def _argv(jail: Jail) -> list[str]:
    return Sandbox(BWRAP, sandbox.python_roots()).argv([sys.executable, "-m", "x"], jail)


def _pairs(argv: list[str], option: str, arity: int = 2) -> list[tuple[str, ...]]:
    return [tuple(argv[i + 1:i + 1 + arity]) for i, a in enumerate(argv) if a == option]


def test_the_sandbox_has_its_own_namespaces_and_shares_only_the_network(tmp_path: Path) -> None:
    argv = _argv(Jail(bundle=tmp_path))
    assert argv[0] == BWRAP
    assert {"--unshare-all", "--share-net", "--new-session", "--die-with-parent"} <= set(argv)
    assert ("/proc",) in _pairs(argv, "--proc", 1) and ("/dev",) in _pairs(argv, "--dev", 1)
    assert {("/tmp",), (HOME,)} <= set(_pairs(argv, "--tmpfs", 1))
    assert argv[argv.index("--") + 1:] == [sys.executable, "-m", "x"]


def test_a_zygotes_sandbox_outlives_the_zygote_for_its_replicas(tmp_path: Path) -> None:
    assert "--die-with-parent" not in _argv(Jail(bundle=tmp_path, outlive_command=True))


def test_its_bundle_is_read_only_at_a_fixed_path_and_its_working_directory(tmp_path: Path) -> None:
    argv = _argv(Jail(bundle=tmp_path / "bundles" / "abc"))
    assert (str(tmp_path / "bundles" / "abc"), BUNDLE) in _pairs(argv, "--ro-bind")
    assert (BUNDLE,) in _pairs(argv, "--chdir", 1)
    assert not [p for p in _pairs(argv, "--bind") if p[0].startswith(str(tmp_path))]


def test_the_python_environment_is_read_only_but_not_the_repository_around_it(tmp_path: Path) -> None:
    roots = {Path(src) for src, dest in _pairs(_argv(Jail(bundle=tmp_path)), "--ro-bind") if src == dest}
    assert REPO / "sdk" in roots and REPO / "runtime" in roots
    assert REPO not in roots and REPO / "platform" not in roots and REPO / ".ember" not in roots
    assert Path(sys.prefix).resolve() in roots or Path(sys.prefix) in roots or \
        any(Path(sys.prefix).resolve().is_relative_to(r) for r in roots)
    assert not [r for r in roots if r in (Path("/"), Path("/home"), Path("/root"), Path("/etc"))]


def test_only_the_assigned_gpus_and_writable_folders_are_bound(tmp_path: Path) -> None:
    argv = _argv(Jail(bundle=tmp_path, devices=("/dev/nvidia1", "/dev/nvidiactl"), writable=(tmp_path / "w",)))
    assert _pairs(argv, "--dev-bind-try") == [("/dev/nvidia1", "/dev/nvidia1"), ("/dev/nvidiactl", "/dev/nvidiactl")]
    assert _pairs(argv, "--bind") == [(str(tmp_path / "w"), str(tmp_path / "w"))]


def test_gpu_device_nodes_are_those_of_its_gpus_and_the_shared_ones_that_exist(tmp_path: Path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert gpu_devices([1], tmp_path) == (str(tmp_path / "nvidia1"), str(tmp_path / "nvidiactl"),
                                          str(tmp_path / "nvidia-uvm"))
    assert gpu_devices([], tmp_path) == ()  # a CPU replica: no device at all
    assert gpu_devices([7], tmp_path) == (str(tmp_path / "nvidiactl"), str(tmp_path / "nvidia-uvm"))


def test_a_declared_inventorys_gpus_have_stand_in_nodes_bound_where_real_ones_would_be(tmp_path: Path) -> None:
    gpus = [Device(kind="gpu", index=i, name="H100", uuid=f"GPU-v-{i}") for i in (0, 1)]
    mig = Device(kind="gpu", index=1, name="H100 MIG 1g.10gb", uuid="MIG-v-1-0", mig_profile="1g.10gb")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_text("an older agent's stand-in")  # replaced by a link
    folder = devices.stand_ins(tmp_path / "dev", [*gpus, mig, Device(kind="cpu", index=0, name="cpu")])
    made = sorted(folder.iterdir())
    assert [p.name for p in made] == ["nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1",
                                      "nvidiactl"]
    assert all(p.is_symlink() and os.readlink(p) == os.devnull for p in made)  # a device that holds nothing
    nodes = gpu_devices([1], folder)
    assert [Path(n).name for n in nodes] == ["nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                                             "nvidia-modeset"]
    assert _pairs(_argv(Jail(bundle=tmp_path, devices=nodes)), "--dev-bind-try") == \
        [(n, f"/dev/{Path(n).name}") for n in nodes]  # GPU 0's stand-in is not there, as GPU 0's node would not be
    assert devices.stand_ins(folder, gpus) == folder and sorted(folder.iterdir()) == made  # the agent's next start


AGENT_ENV = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "HOME": "/root", "TZ": "UTC",
             "AWS_SECRET_ACCESS_KEY": "nope", "EMBER_TOKEN": "nope", "EMBER_STATE_DIR": "/var/ember",
             "OMP_NUM_THREADS": "4", "EMBER_ACK_WAIT_S": "3", "PYTHONPATH": "/agent/src",
             "EMBER_TEST_CRASH_AT": "before-record", "EMBER_TEST_CRASH_DIR": "/tmp"}  # no switch of a test's


def test_only_allow_listed_variables_of_the_agent_reach_a_replica() -> None:
    env = environment({"EMBER_DEVICE": "cpu", "EMBER_NATS_CREDS": "creds"}, AGENT_ENV, sandboxed=True,
                      secrets={"HF_TOKEN": "hf"})
    assert env == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "TZ": "UTC", "OMP_NUM_THREADS": "4",
                   "EMBER_ACK_WAIT_S": "3", "PYTHONUNBUFFERED": "1", "EMBER_DEVICE": "cpu",
                   "EMBER_NATS_CREDS": "creds", "HF_TOKEN": "hf", "HOME": HOME, "TMPDIR": "/tmp"}


def test_only_a_virtual_gpu_table_is_a_folder_a_replica_may_write(tmp_path: Path) -> None:
    """A test's fault lives in the app it pushes, not in a variable the agent honours: no folder named by an
    ``EMBER_TEST_*`` variable is bound writable."""
    env = {"EMBER_TEST_CRASH_DIR": str(tmp_path), "EMBER_VIRTUAL_GPU_PROCESSES": str(tmp_path / "gpus")}
    (tmp_path / "gpus").mkdir()
    assert writable_folders(env) == (tmp_path / "gpus",)


def test_the_same_allow_list_holds_without_a_sandbox_which_keeps_the_agents_home() -> None:
    env = environment({"EMBER_DEVICE": "cpu"}, AGENT_ENV, sandboxed=False)
    assert "AWS_SECRET_ACCESS_KEY" not in env and "EMBER_TOKEN" not in env and "PYTHONPATH" not in env
    assert env["HOME"] == "/root" and env["EMBER_DEVICE"] == "cpu"


def test_a_replica_runs_the_ember_of_its_agent_from_a_source_checkout_and_nothing_else_of_its_pythonpath() -> None:
    sdk, runtime = Path(ember.__file__).parent.parent, Path(ember_runtime.__file__).parent.parent
    path = os.pathsep.join(["/agent/src", str(sdk), str(sdk.parent / "platform"), str(runtime), "relative", str(sdk)])
    for sandboxed in (True, False):
        env = environment({}, {**AGENT_ENV, "PYTHONPATH": path}, sandboxed=sandboxed)
        assert env["PYTHONPATH"] == os.pathsep.join([str(sdk), str(runtime)])


def test_no_environment_value_is_on_bwraps_command_line(tmp_path: Path) -> None:
    argv = _argv(Jail(bundle=tmp_path))
    assert "--setenv" not in argv and not [a for a in argv if "nope" in a]


def test_a_signal_bwrap_reports_as_128_plus_n_is_a_negative_code_again() -> None:
    assert exit_code(128 + signal.SIGKILL) == -signal.SIGKILL
    assert exit_code(128 + signal.SIGTERM) == -signal.SIGTERM
    assert exit_code(3) == 3 and exit_code(0) == 0 and exit_code(-9) == -9 and exit_code(255) == 255


def test_memory_limits_need_a_delegated_cgroup_v2_with_the_memory_controller() -> None:
    mount = Path("/sys/fs/cgroup")
    assert decide(None, "", "", "", True).root is None
    v1 = decide(Path("/sys/fs/cgroup/unified"), "/", "hugetlb", "", True)
    assert v1.root is None and "memory controller" in v1.reason
    locked = decide(mount, "/system.slice/ember.service", "cpu memory pids", "", False)
    assert locked.root is None and "not writable" in locked.reason
    ready = decide(mount, "/system.slice/ember.service", "cpu memory pids", "memory", True)
    assert ready.root == mount / "system.slice/ember.service" and not ready.move_agent
    first = decide(mount, "/user.slice/ember", "cpu memory", "cpu", True)
    assert first.root is not None and first.move_agent  # the agent leaves for a leaf, then children get memory


def test_a_node_without_bwrap_runs_unsandboxed_only_when_told(monkeypatch) -> None:
    monkeypatch.setattr(sandbox, "bwrap_candidates", list)
    assert not Sandbox.for_node("if-possible").enabled
    assert not Sandbox.for_node("off").enabled
    try:
        Sandbox.for_node("required")
    except sandbox.SandboxUnavailable as exc:
        assert "bwrap not found" in str(exc)
    else:
        raise AssertionError("a node that requires sandboxes started without one")


def test_a_bwrap_that_cannot_make_a_sandbox_here_gives_way_to_the_next(monkeypatch, tmp_path: Path) -> None:
    broken = tmp_path / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setattr(sandbox, "bwrap_candidates", lambda: [str(broken)])
    assert not Sandbox.for_node("if-possible").enabled
    try:
        Sandbox.for_node("required")
    except sandbox.SandboxUnavailable as exc:
        assert "Permission denied" in str(exc)  # bwrap's own words
    else:
        raise AssertionError("a broken bwrap was taken")
    working = tmp_path / "ok"
    working.write_text("#!/bin/sh\nexit 0\n")
    working.chmod(0o755)
    monkeypatch.setattr(sandbox, "bwrap_candidates", lambda: [str(broken), str(working)])
    assert Sandbox.for_node("required").bwrap == str(working)


def test_an_images_environment_is_bound_read_only_and_nothing_twice(tmp_path: Path) -> None:
    env = tmp_path / "envs" / ("a" * 64)
    layer = tmp_path / "envs" / "runtime" / "k"
    inside_python = sandbox.python_roots()[0] / "lib"  # already seen through a Python root
    argv = _argv(Jail(bundle=tmp_path, readonly=(env, layer, Path("/usr"), inside_python)))
    binds = _pairs(argv, "--ro-bind")
    assert (str(env), str(env)) in binds and (str(layer), str(layer)) in binds
    assert binds.count(("/usr", "/usr")) <= 1 and (str(inside_python), str(inside_python)) not in binds
    assert (str(env), str(env)) not in _pairs(argv, "--bind")  # never writable
    assert (str(env), str(env)) not in _pairs(_argv(Jail(bundle=tmp_path)), "--ro-bind")  # only for its image
