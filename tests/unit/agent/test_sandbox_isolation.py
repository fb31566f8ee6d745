"""A real sandbox (bwrap, as the agent starts a replica in one): what code inside sees and may do.

Each test runs a small Python program in a sandbox made by ``ember_runtime.agent.sandbox`` for a bundle in
a node state dir laid out as the agent's, next to another app's bundle, and reads what it printed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from functools import partial
from pathlib import Path

import pytest

from ember_runtime import hostpid
from ember_runtime.agent import sandbox
from ember_runtime.agent.bundles import make_read_only, remove_tree
from ember_runtime.agent.sandbox import Jail, Sandbox, environment


@pytest.fixture
def state(tmp_path: Path):
    """A node state dir: this app's bundle and another app's, both read-only as the agent leaves them."""
    bundles = tmp_path / "node" / "bundles"
    for name, text in (("mine", "my code"), ("theirs", "their secret weights")):
        (bundles / name).mkdir(parents=True)
        (bundles / name / "model.py").write_text(text)
        make_read_only(bundles / name)
    (tmp_path / "node" / "agent.key").write_text("the agent's own file")
    yield tmp_path / "node"
    remove_tree(bundles)


def run(node_sandbox: Sandbox, bundle: Path, code: str, env: dict[str, str] | None = None,
        timeout_s: float = 60.0) -> tuple[int, dict]:
    """Run ``code`` in a sandbox; its exit code and the JSON it printed last."""

    async def go() -> tuple[int, bytes]:
        proc = await sandbox.start(node_sandbox, [sys.executable, "-c", code], Jail(bundle=bundle),
                                   environment(env or {}, sandboxed=True), partial(sandbox.prepare_child, None))
        assert proc.stdout is not None
        out = await asyncio.wait_for(proc.stdout.read(), timeout_s)
        return await proc.wait(), out

    code_, out = asyncio.run(go())
    lines = out.decode().strip().splitlines()
    return code_, json.loads(lines[-1]) if lines else {}


PROBE = """
import json, os, resource
def attempt(f):
    try:
        return "ok: " + repr(f())[:80]
    except Exception as e:
        return type(e).__name__
seen = {{
    "other_bundle": attempt(lambda: open({theirs!r}).read()),
    "state_dir": attempt(lambda: os.listdir({state!r})),
    "agent_file": attempt(lambda: open({agent_file!r}).read()),
    "write_bundle": attempt(lambda: open("/bundle/model.py", "a").write("x")),
    "new_in_bundle": attempt(lambda: open("/bundle/new.py", "w").write("x")),
    "own_bundle": attempt(lambda: open("/bundle/model.py").read()),
    "cwd": os.getcwd(),
    "tmp": sorted(os.listdir("/tmp")),
    "write_tmp": attempt(lambda: open("/tmp/mine", "w").write("x")),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "env": dict(os.environ),
    "core": resource.getrlimit(resource.RLIMIT_CORE),
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
    "home": attempt(lambda: open(os.path.expanduser("~/x"), "w").write("x")),
}}
print(json.dumps(seen))
"""


def test_a_sandboxed_process_sees_its_bundle_and_nothing_else_of_the_node(node_sandbox, state, monkeypatch,
                                                                           tmp_path) -> None:
    monkeypatch.setenv("EMBER_FAKE_SECRET", "hunter2")  # in the agent's environment: must not reach the replica
    (Path("/tmp") / f"host-marker-{os.getpid()}").write_text("host")
    try:
        code, seen = run(node_sandbox, state / "bundles" / "mine", PROBE.format(
            theirs=str(state / "bundles" / "theirs" / "model.py"), state=str(state),
            agent_file=str(state / "agent.key")))
    finally:
        (Path("/tmp") / f"host-marker-{os.getpid()}").unlink()
    assert code == 0, seen
    assert seen["other_bundle"] == "FileNotFoundError"
    assert seen["state_dir"] == "FileNotFoundError"
    assert seen["agent_file"] == "FileNotFoundError"
    refused = ("OSError", "PermissionError")  # a read-only file system; without capabilities, its modes first
    assert seen["write_bundle"] in refused and seen["new_in_bundle"] in refused
    assert seen["own_bundle"] == "ok: 'my code'" and seen["cwd"] == "/bundle"
    mounted = {r.relative_to("/tmp").parts[0] for r in sandbox.python_roots() if r.is_relative_to("/tmp")}
    assert set(seen["tmp"]) <= mounted and seen["write_tmp"].startswith("ok")  # a private /tmp, empty at start
    assert not (Path("/tmp") / "mine").exists() and f"host-marker-{os.getpid()}" not in seen["tmp"]
    assert seen["pids"] == [1, 2]  # bwrap's pid 1 and itself: no other process of the node
    assert "EMBER_FAKE_SECRET" not in seen["env"] and "hunter2" not in json.dumps(seen["env"])
    assert seen["env"]["HOME"] == sandbox.HOME and seen["home"].startswith("ok")
    assert seen["core"] == [0, 0] and seen["nofile"][0] <= sandbox.OPEN_FILES


def test_the_exit_code_comes_back_through_bwrap(node_sandbox, state) -> None:
    code, _ = run(node_sandbox, state / "bundles" / "mine", "import sys; print('{}'); sys.exit(7)")
    assert code == 7
    code, _ = run(node_sandbox, state / "bundles" / "mine", "import os, signal; os.kill(os.getpid(), 9)")
    assert code == -signal.SIGKILL


def test_signalling_the_sandboxs_group_reaches_every_process_in_it(node_sandbox, state) -> None:
    """SIGTERM on the group reaches the command (it drains: here, it exits 0 in its handler) and a process
    it started; SIGKILL on the group ends whatever is left."""
    code = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
signal.signal(signal.SIGTERM, lambda *_: (child.wait(), print("drained", child.returncode, flush=True), sys.exit(0)))
print("ready", flush=True)
time.sleep(600)
"""

    async def go() -> tuple[int, list[str]]:
        proc = await sandbox.start(node_sandbox, [sys.executable, "-c", code], Jail(bundle=state / "bundles" / "mine"),
                                   environment({}, sandboxed=True), partial(sandbox.prepare_child, None))
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"ready"
        proc.send_signal(signal.SIGTERM)
        lines = [(await asyncio.wait_for(proc.stdout.readline(), 60)).decode().strip()]
        return await asyncio.wait_for(proc.wait(), 60), lines

    code_, lines = asyncio.run(go())
    assert code_ == 0
    assert lines == [f"drained {-signal.SIGTERM}"]  # the child got the group's SIGTERM too


def test_a_sandboxed_process_learns_its_pid_on_the_node(node_sandbox, state) -> None:
    bundle = state / "bundles" / "mine"
    ours, theirs = hostpid.socket_pair()
    code = ("import json, os, sys; from ember_runtime import hostpid; host = hostpid.learn(); "
            "print(json.dumps({'inside': os.getpid(), 'host': host, 'env': os.environ['EMBER_HOST_PID']}))")

    async def go() -> tuple[int, int, dict]:
        env = {**environment({}, sandboxed=True), hostpid.FD_ENV: str(theirs.fileno())}
        proc = await sandbox.start(node_sandbox, [sys.executable, "-c", code], Jail(bundle=bundle), env,
                                   partial(sandbox.prepare_child, None), pass_fds=[theirs.fileno()])
        theirs.close()
        _, told = await asyncio.wait_for(hostpid.answer(ours), 60)
        assert proc.stdout is not None
        out = await asyncio.wait_for(proc.stdout.read(), 60)
        ours.close()
        return await proc.wait(), told, json.loads(out)

    code_, told, seen = asyncio.run(go())
    assert code_ == 0
    assert seen["inside"] == 2 and seen["host"] == told == int(seen["env"]) != 2


CAPABILITIES = """
import json, subprocess
caps = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff:"))
remount = subprocess.run(["mount", "-o", "remount,rw,bind", "/bundle"], capture_output=True)
print(json.dumps({"caps": caps, "remount": remount.returncode}))
"""


def test_a_sandboxed_process_holds_no_capability_even_when_the_agent_is_root(node_sandbox, state) -> None:
    """bwrap run by root keeps every capability in the sandbox's own namespaces unless told: code inside could
    remount its read-only bundle and environment writable (and write through to the node's files), or rewrite its
    network's routes. (The suite runs as root in CI; a non-root agent's sandbox had none already.)"""
    code, seen = run(node_sandbox, state / "bundles" / "mine", CAPABILITIES)
    assert code == 0, seen
    assert int(seen["caps"], 16) == 0, seen
    assert seen["remount"] != 0
    assert (state / "bundles" / "mine" / "model.py").read_text() == "my code"
