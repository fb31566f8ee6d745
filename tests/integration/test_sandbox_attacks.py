"""A hostile app deployed next to a normal one, on the session platform, tries from inside its replica (forked
from its zygote, in its sandbox) to read the node: another app's bundle, the agent's state dir and
environment, other processes; to change its own code; and to ask a zygote for a replica through a socket.
Every attempt fails, and the normal app keeps answering correctly. A tenant's replica (a ``tenant-*`` deploy
token's app) tries to reach the node's ports, another app's replica and the internet: it reaches NATS, and the
internet unless its function has ``block_network=True``; nothing else.

Where this machine's kernel allows no sandbox, the platform runs replicas unsandboxed and this test is skipped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from contextlib import closing
from pathlib import Path

import msgspec
import pytest
from support.listeners import accepting
from support.polling import wait_for
from support.streams import read_lines

from ember._client import Transport
from ember._deploy import deploy
from ember.wire import AppView, StatusView
from ember_runtime.agent.zygote_socket import socket_name

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
            "records": attempt(lambda: os.listdir(targets["records"])),
            "other_output": attempt(lambda: os.open(targets["other_output"], os.O_RDONLY | os.O_NONBLOCK)),
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
    # its own zygote's socket exists, on the node
    assert str(node / "zygotes" / socket_name(("hostile", "Snoop", view.version))) in sockets
    other = next(p for p in (node / "bundles").glob("*/hello.py"))
    # another app's replica record and output (a FIFO): the agent's, for a restarted agent to adopt that replica
    other_output = next(p for p in (node / "replicas").glob("hello-*/stdout"))
    agent_pid = platform._procs["agent"].pid
    agent_env = Path(f"/proc/{agent_pid}/environ").read_bytes()
    assert b"PYTEST_CURRENT_TEST=" in agent_env  # something of the agent's own that no replica may see
    targets = {"other_bundle_file": str(other), "bundles": str(node / "bundles"), "state_dir": str(node),
               "agent_pid": agent_pid, "zygote_sockets": sockets, "records": str(node / "replicas"),
               "other_output": str(other_output)}

    response = http.post("/v1/hostile/Snoop.snoop", json=targets)
    assert response.status_code == 200, response.text
    seen = response.json()
    assert seen["other_bundle"] == "FileNotFoundError"
    assert seen["bundles"] == "FileNotFoundError" and seen["state_dir"] == "FileNotFoundError"
    assert seen["records"] == "FileNotFoundError" and seen["other_output"] == "FileNotFoundError"
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


NETWORK = '''
import ctypes, errno, os, socket, struct, threading
import ember

app = ember.App("{name}")


def door(port):
    """Ask this sandbox's NATS door for a connection to ``port`` of the node's loopback."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(os.environ["EMBER_NATS_DOOR"])
        s.sendall(f"127.0.0.1 {{port}}".encode())
        words, fds, _, _ = socket.recv_fds(s, 512, 1)
    for fd in fds:
        os.close(fd)
    return "ok" if fds else "refused"


def turn(nats, port):
    """A socket from the door, connected to NATS, its connection undone (AF_UNSPEC) and made to ``port``."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(os.environ["EMBER_NATS_DOOR"])
        s.sendall(f"127.0.0.1 {{nats}}".encode())
        words, fds, _, _ = socket.recv_fds(s, 512, 1)
    with socket.socket(fileno=fds[0]) as tcp:
        unspec = struct.pack("@H14x", socket.AF_UNSPEC)
        if ctypes.CDLL(None, use_errno=True).connect(tcp.fileno(), unspec, len(unspec)) != 0:
            return "not undone"
        tcp.settimeout(2)
        tcp.connect(("127.0.0.1", port))
        return "ok"


def where():
    """Its door: the path, what its folder holds, the socket's identity on the node."""
    path = os.environ["EMBER_NATS_DOOR"]
    return [path, sorted(os.listdir(os.path.dirname(path))), os.stat(path).st_ino]


def reach(host, port):
    try:
        if host == "door":
            return door(port)
        if host.startswith("turn:"):
            return turn(int(host[5:]), port)
        with socket.create_connection((host, port), timeout=3):
            return "ok"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


@app.model(min_replicas=1, max_replicas=1)
class Open:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.ready = True

    @ember.method
    def reach(self, targets: list) -> list:
        return [reach(host, port) for host, port in targets]

    @ember.method
    def door(self) -> list:
        return where()


@app.model(min_replicas=1, max_replicas=1, block_network=True)
class Sealed:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.ready = True

    @ember.method
    def reach(self, targets: list) -> list:
        return [reach(host, port) for host, port in targets]

    @ember.method
    def door(self) -> list:
        return where()
'''

SERVER = '''
import socket, threading
import ember

app = ember.App("{name}")
LISTENING = []


@app.function(min_replicas=1, max_replicas=1)
def serve() -> dict:
    """A server of this replica's own, on every address of its network; and whether the replica reaches it."""
    if not LISTENING:
        server = socket.create_server(("0.0.0.0", 0))
        threading.Thread(target=lambda: [server.accept()[0].close() for _ in iter(int, 1)], daemon=True).start()
        LISTENING.append(server)
    port = LISTENING[0].getsockname()[1]
    with socket.create_connection(("127.0.0.1", port), timeout=10):
        return {{"port": port, "reached": "ok"}}
'''

OUTSIDE = ("203.0.113.1", 9)  # TEST-NET-3: an address out on the internet (nothing answers there)


def _node_address() -> str | None:
    """This node's address on its default route (not loopback); None where it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(OUTSIDE)
        except OSError:
            return None
        return str(probe.getsockname()[0])


def _replicas(transport, app: str, service: str) -> list:
    view = msgspec.json.decode(transport.request("GET", f"/v1/apps/{app}").content, type=AppView)
    return [r for s in view.services if s.name == service for r in s.replicas]


def _fork_from_zygotes(transport, app: str, services: tuple[str, ...]) -> None:
    """Each service's replica forked from its zygote: one that started before the zygote was built is killed, and
    the agent starts it again from the zygote."""
    for service in services:
        wait_for(lambda s=service: any(z.app == app and z.service == s and z.state == "ready"
                                       for n in _status(transport).nodes for z in n.zygotes),
                 timeout_s=180, what=f"the zygote of {service}")
        (replica,) = _replicas(transport, app, service)
        if replica.start is None or replica.start.kind != "zygote":
            os.kill(replica.pid, signal.SIGKILL)
        wait_for(lambda s=service: [(r.state, r.start.kind if r.start else "") for r in _replicas(transport, app, s)]
                 == [("ready", "zygote")], timeout_s=180, what=f"{service}'s replica, forked from its zygote")


def _tenant(http, apps: list[str]) -> str:
    made = http.post("/v1/tokens", json={"scopes": ["deploy"], "apps": apps, "name": f"net-{uuid.uuid4().hex[:6]}"})
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def test_a_replica_reaches_nats_and_nothing_else_of_the_node(tmp_path, transport, http, platform, ember_cli):
    agent_log = (platform.log_dir / "agent.log").read_text()
    if "replicas run WITHOUT a sandbox" in agent_log or "sandboxes share the node's network" in agent_log:
        pytest.skip("this machine gives sandboxes no network of their own (no bwrap or no pasta)")
    fenced = "NATS socket can be pointed at any port" not in agent_log  # else the node's status says so (below)
    assert fenced or not os.environ.get("EMBER_TEST_REQUIRE_FENCE"), agent_log[-2000:]
    mine, theirs = f"tenant-{uuid.uuid4().hex[:6]}", f"team-b-{uuid.uuid4().hex[:6]}"
    (tmp_path / "net").mkdir()
    (tmp_path / "srv").mkdir()
    (tmp_path / "net" / "netprobe.py").write_text(NETWORK.format(name=mine))
    (tmp_path / "srv" / "server.py").write_text(SERVER.format(name=theirs))
    with closing(Transport(platform.url, token=_tenant(http, ["tenant-*"]))) as tenant:
        deploy(tmp_path / "net" / "netprobe.py", transport=tenant, timeout_s=180)
    deploy(tmp_path / "srv" / "server.py", transport=transport, timeout_s=180)
    _fork_from_zygotes(transport, mine, ("Open", "Sealed"))  # each shares its zygote's sandbox and network
    loopback, everywhere = accepting("127.0.0.1"), accepting("0.0.0.0")
    try:
        served = http.post(f"/v1/{theirs}/serve", json={})
        assert served.status_code == 200, served.text
        assert served.json()["reached"] == "ok"  # the other app's replica reaches its own server
        nats_port = int(platform.nats_url.rsplit(":", 1)[1])
        platform_port = int(platform.url.rsplit(":", 1)[1])
        targets = {"nats": ["127.0.0.1", nats_port], "platform": ["127.0.0.1", platform_port],
                   "door_nats": ["door", nats_port], "door_platform": ["door", platform_port],
                   "turned_to_platform": [f"turn:{nats_port}", platform_port],  # NATS' socket pointed elsewhere
                   "turned_to_loopback": [f"turn:{nats_port}", loopback.getsockname()[1]],
                   "node_loopback": ["127.0.0.1", loopback.getsockname()[1]],
                   "other_replica": ["127.0.0.1", served.json()["port"]], "outside": list(OUTSIDE),
                   "metadata": ["169.254.169.254", 80]}  # a cloud's metadata service: the node's credentials
        if (address := _node_address()) is not None:
            targets["node_address"] = [address, everywhere.getsockname()[1]]
        with socket.create_connection(("127.0.0.1", loopback.getsockname()[1]), timeout=10):
            pass  # the node itself reaches its own servers
        seen = {}
        for service in ("Open", "Sealed"):
            answer = http.post(f"/v1/{mine}/{service}.reach", json=list(targets.values()))
            assert answer.status_code == 200, answer.text  # NATS works: each serves its calls
            seen[service] = dict(zip(targets, answer.json(), strict=True))
        for reached in seen.values():  # NATS through its door alone (no service was given a network option)
            assert reached["door_nats"] == "ok" and reached["door_platform"] == "refused", seen
            assert reached["nats"] == "ECONNREFUSED", seen
            assert reached["platform"] == reached["node_loopback"] == reached["other_replica"] == "ECONNREFUSED", seen
            assert reached.get("node_address", "ECONNREFUSED") in ("ECONNREFUSED", "ENETUNREACH"), seen
            if fenced:  # its packets dropped by the door sockets' filter (doorwall)
                assert reached["turned_to_platform"] == reached["turned_to_loopback"] == "EPERM", seen
        assert seen["Open"]["metadata"] in ("ENETUNREACH", "EHOSTUNREACH"), seen  # unreachable, not tried
        assert seen["Sealed"]["outside"] == "ENETUNREACH", seen  # block_network: no way out
        assert seen["Open"]["outside"] != "ENETUNREACH", seen  # the default: a way out (nothing answers there)
        status = ember_cli("status", url=platform.url).stdout
        assert "bwrap, own network" in status and fenced != ("NATS socket can be pointed" in status), status
        doors = [http.post(f"/v1/{mine}/{service}.door", json={}).json() for service in ("Open", "Sealed")]
        assert all(listed == ["nats.sock"] for _, listed, _ in doors), doors  # a folder of its own: no other door
        assert doors[0][2] != doors[1][2], doors  # each sandbox its own socket
    finally:
        loopback.close()
        everywhere.close()
        for app in (mine, theirs):
            transport.request("DELETE", f"/v1/apps/{app}")


def test_ember_dev_says_in_its_own_output_when_sandboxes_share_the_machines_network(tmp_path) -> None:
    """A machine without pasta (here: a PATH without it): replicas run, on the machine's network, and ``ember dev``
    says so before anything else, not only in the agent's log."""
    env = {k: v for k, v in os.environ.items() if k not in ("EMBER_URL", "EMBER_TOKEN")}
    env["PATH"] = str(Path(sys.executable).parent)  # Ember's own tools (nats-server, bwrap), no pasta
    cmd = [sys.executable, "-m", "ember.cli", "dev", "--port", "0", "--state-dir", str(tmp_path / "state")]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          start_new_session=True) as dev:
        lines: list[str] = []
        reader = read_lines(dev.stdout, lines.append)
        try:
            wait_for(lambda: any(line.startswith("export EMBER_TOKEN=") for line in lines), timeout_s=120,
                     what="ember dev to be up")
        finally:
            dev.send_signal(signal.SIGINT)
            dev.wait(timeout=90)
            reader.join(timeout=10)
    said = "".join(lines)
    if "replicas run UNSANDBOXED" in said:
        pytest.skip("this machine allows no sandbox at all")
    assert "WARNING: replicas share the node's network: pasta not found" in said, said
    assert said.index("WARNING:") < said.index("export EMBER_TOKEN=")
