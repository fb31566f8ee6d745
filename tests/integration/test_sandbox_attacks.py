"""A hostile app deployed next to a normal one, on the session platform, tries from inside its replica (forked
from its zygote, in its sandbox) to read the node: another app's bundle, the agent's state dir and
environment, other processes; to change its own code; and to ask a zygote for a replica through a socket.
Every attempt fails, and the normal app keeps answering correctly.

Where this machine's kernel allows no sandbox, the platform runs replicas unsandboxed and this test is skipped."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
from support.polling import wait_for

from ember._deploy import deploy
from ember.wire import StatusView

pytestmark = pytest.mark.integration

HOSTILE = '''
import json, os, socket, stat
import ember

app = ember.App("hostile")


def attempt(action):
    try:
        return "ok: " + repr(action())[:200]
    except Exception as exc:
        return type(exc).__name__


def ask_for_a_replica(conn):
    """What the agent sends a zygote: a fork request with two descriptors."""
    r, w = os.pipe()
    try:
        request = json.dumps({"argv": ["--app", "hello"], "env": {}, "cpus": []}).encode()
        socket.send_fds(conn, [request], [w, w])
        conn.settimeout(5)
        reply = json.loads(conn.recv(65536) or b"{}")
        return "FORKED" if reply.get("pid") else f"refused: {reply.get('error', '')}"
    finally:
        os.close(r)
        os.close(w)


def fork_through(path):
    def go():
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.connect(path)
            return ask_for_a_replica(conn)
    return attempt(go)


def inherited_sockets():
    """Every Unix socket of the zygote protocol's kind (SOCK_SEQPACKET) this process holds, and what it gives
    when used as a zygote's listener or as a connection to one."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock:
            if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
                continue
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                sock.setblocking(False)
                found[name] = "listening: " + attempt(sock.accept)
            else:
                found[name] = attempt(lambda: ask_for_a_replica(sock))
    return found


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@app.model(min_replicas=1, max_replicas=1)
class Snoop:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.ready = True

    @ember.method
    def snoop(self, targets: dict) -> dict:
        return {
            "other_bundle": attempt(lambda: open(targets["other_bundle_file"]).read()),
            "bundles": attempt(lambda: os.listdir(targets["bundles"])),
            "state_dir": attempt(lambda: os.listdir(targets["state_dir"])),
            "agent_environ": attempt(lambda: open(f"/proc/{targets['agent_pid']}/environ", "rb").read()),
            "environ": sorted(os.environ),
            "own_code": attempt(lambda: open(os.path.join(os.getcwd(), "hostile.py"), "a").write("# mine now")),
            "own_folder": attempt(lambda: open(os.path.join(os.getcwd(), "new.py"), "w").write("x")),
            "processes": [cmdline(p) for p in os.listdir("/proc") if p.isdigit()],
            "zygote_sockets": {p: fork_through(p) for p in targets["zygote_sockets"]},
            "inherited": inherited_sockets(),
        }
'''


def _status(transport) -> StatusView:
    return msgspec.json.decode(transport.request("GET", "/v1/status").content, type=StatusView)


def test_a_hostile_replica_reads_nothing_of_the_node_and_cannot_fork(tmp_path, transport, http, platform, hello):
    agent_log = (platform.log_dir / "agent.log").read_text()
    if "replicas run WITHOUT a sandbox" in agent_log:
        pytest.skip("this machine's kernel allows no sandbox: replicas run unsandboxed")
    (tmp_path / "hostile.py").write_text(HOSTILE)
    view = deploy(tmp_path / "hostile.py", transport=transport, timeout_s=180)
    wait_for(lambda: any(z.app == "hostile" and z.state == "ready" for n in _status(transport).nodes
                         for z in n.zygotes), what="the hostile app's zygote")

    node = platform.state_dir / "node"
    sockets = sorted(str(p) for p in (node / "zygotes").glob("*.sock"))
    assert any("hostile" in s for s in sockets)  # its own zygote's socket exists, on the node
    other = next(p for p in (node / "bundles").glob("*/hello.py"))
    agent_pid = platform._procs["agent"].pid
    agent_env = Path(f"/proc/{agent_pid}/environ").read_bytes()
    assert b"PYTEST_CURRENT_TEST=" in agent_env  # something of the agent's own that no replica may see
    targets = {"other_bundle_file": str(other), "bundles": str(node / "bundles"), "state_dir": str(node),
               "agent_pid": agent_pid, "zygote_sockets": sockets}

    response = http.post("/v1/hostile/Snoop.snoop", json=targets)
    assert response.status_code == 200, response.text
    seen = response.json()
    assert seen["other_bundle"] == "FileNotFoundError"
    assert seen["bundles"] == "FileNotFoundError" and seen["state_dir"] == "FileNotFoundError"
    assert seen["agent_environ"] == "FileNotFoundError"  # no such process in its pid namespace
    assert "PYTEST_CURRENT_TEST" not in seen["environ"]
    assert not [k for k in seen["environ"] if "TOKEN" in k or "SECRET" in k]
    assert seen["own_code"] in ("OSError", "PermissionError") and seen["own_folder"] in ("OSError", "PermissionError")
    assert not [c for c in seen["processes"] if "hello" in c or c.split()[1:3] == ["-m", "ember_runtime"]], \
        seen["processes"]  # neither the agent nor another app's replica
    assert seen["zygote_sockets"] and set(seen["zygote_sockets"].values()) == {"FileNotFoundError"}
    assert not [v for v in seen["inherited"].values() if "FORKED" in v or v.startswith("listening")], \
        seen["inherited"]
    replica = next(r for s in view.services for r in s.replicas)
    assert replica.start is not None and replica.start.kind == "zygote"  # it shares its zygote's sandbox

    # Its bundle on the node is as it was unpacked, and the normal app still answers correctly.
    assert [p.read_text() for p in (node / "bundles").glob("*/hostile.py")] == [HOSTILE]
    assert http.post("/v1/hello/norm", json={"x": 3, "y": 4}).json() == 5.0
    assert os.path.exists(other)
    transport.request("DELETE", "/v1/apps/hostile")
