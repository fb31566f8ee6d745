"""The door sockets' fence (``doorwall``), on this kernel: a socket the door smith made reaches NATS' servers, and,
disconnected and pointed elsewhere or bound to a port of the node, nothing; it stays so once the smith and its
cgroup are gone. Where the node cannot fence (no cgroup v2 the agent may write, no privilege to load the
programs), it says why; ``EMBER_TEST_REQUIRE_FENCE=1`` (CI, as root) makes that a failure, not a skip."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.listeners import accepting

from ember_runtime import natsdoor
from ember_runtime.agent import bpf, cgroups, doorwall, netns, sandbox

EPERM = os.strerror(1)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            return True
    except OSError:
        return False


@pytest.fixture
def servers() -> Iterator[list[socket.socket]]:
    """NATS' stand-ins (IPv4, and IPv6 where the loopback has it) and another service of the node."""
    made = [accepting(), accepting()] + ([accepting("::1", socket.AF_INET6)] if _has_ipv6_loopback() else [])
    yield made
    for each in made:
        each.close()


NOT_HERE = ("no cgroup v2", "cannot make a cgroup", "Operation not permitted", "no bpf system call")


def _wall(servers: list[tuple[str, int]]) -> doorwall.DoorWall:
    """A wall, or a skip where the node allows none (a wall refused for another reason fails the test)."""
    try:
        return doorwall.DoorWall.start(servers)
    except doorwall.WallUnavailable as exc:
        if any(reason in str(exc) for reason in NOT_HERE) and not os.environ.get("EMBER_TEST_REQUIRE_FENCE"):
            pytest.skip(f"this node cannot fence door sockets: {exc}")
        raise


def _undo(tcp: socket.socket) -> None:
    """``connect`` with ``AF_UNSPEC``: the socket's connection undone, as code in a sandbox can."""
    unspec = struct.pack("@H14x", socket.AF_UNSPEC)
    assert ctypes.CDLL(None, use_errno=True).connect(tcp.fileno(), unspec, len(unspec)) == 0


def _pointed(tcp: socket.socket, address: tuple[str, int]) -> str:
    _undo(tcp)
    tcp.setblocking(True)
    tcp.settimeout(1)  # a local connection is made in microseconds; a dropped one never
    try:
        tcp.connect(address)
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return os.strerror(exc.errno or 0)
    return "connected"


def test_a_fenced_socket_reaches_nats_and_pointed_elsewhere_sends_nothing(servers) -> None:
    nats, other = servers[0].getsockname()[:2], servers[1].getsockname()[:2]
    named = [nats] + ([("::1", servers[2].getsockname()[1])] if len(servers) > 2 else [])
    wall = _wall(named)

    async def go() -> list[str]:
        found = []
        for server in named:
            with await wall.connect(server) as tcp:
                assert tcp.getpeername()[:2] == server
                assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                found.append(_pointed(tcp, other if server == nats else ("::1", other[1])))
        return found

    try:
        assert asyncio.run(go()) == [EPERM] * len(named)
        with socket.create_connection(other, timeout=5):
            pass  # the node itself reaches it: the filter is the socket's, not the node's
    finally:
        wall.close()


def test_a_socket_stays_fenced_once_the_smith_and_its_group_are_gone(servers) -> None:
    nats, other = servers[0].getsockname()[:2], servers[1].getsockname()[:2]
    wall = _wall([nats])
    tcp = asyncio.run(wall.connect(nats))
    wall.close()
    assert not wall.group.exists()
    with tcp:
        assert _pointed(tcp, other) == EPERM


def test_a_name_that_resolves_anew_is_let_through(servers) -> None:
    """The filter holds the addresses the NATS URL's names had at the agent's start; a name that resolves to
    another one later (a service's new address) is added before the smith connects to it."""
    nats, other = servers[0].getsockname()[:2], servers[1].getsockname()[:2]
    wall = _wall([])
    try:
        with asyncio.run(wall.connect(("localhost", nats[1]))) as tcp:
            assert tcp.getpeername()[1] == nats[1]
            assert _pointed(tcp, other) == EPERM
    finally:
        wall.close()


def _echo_server() -> socket.socket:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn = server.accept()[0]
                threading.Thread(target=lambda c=conn: [c.sendall(b) for b in iter(lambda: c.recv(64), b"")],
                                 daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_the_fence_only_grows_a_socket_made_before_keeps_working(monkeypatch) -> None:
    """A rebuild (a name resolving to a new address) keeps the addresses of sockets made before, even when a later
    lookup does not give them (DNS answering subsets, a lookup that failed): their packets would be dropped."""
    echo = _echo_server()
    nats = echo.getsockname()[:2]
    wall = _wall([nats])

    async def go() -> bytes:
        made = await wall.connect(nats)
        monkeypatch.setattr(doorwall, "allowed_of", lambda servers: frozenset())  # the next lookup gives nothing
        with contextlib.suppress(OSError):
            (await wall.connect(("127.0.0.2", nats[1]))).close()  # a new address: the fence is made again
        with made:
            made.setblocking(True)
            made.settimeout(2)
            made.sendall(b"still")
            return made.recv(5)

    try:
        assert asyncio.run(go()) == b"still"
    finally:
        wall.close()
        echo.close()


def test_the_smith_refuses_what_does_not_connect(servers) -> None:
    wall = _wall([])
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    try:
        with pytest.raises(ConnectionRefusedError):
            asyncio.run(wall.connect(("127.0.0.1", port)))
        with asyncio.run(wall.connect(servers[0].getsockname()[:2])):
            pass  # and goes on
    finally:
        wall.close()


def test_a_fenced_socket_takes_no_port_of_the_node(servers) -> None:
    """Bound to a port of the node, a door socket would keep a service (NATS, the platform) from it."""
    wall = _wall([servers[0].getsockname()[:2]])
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    try:
        with asyncio.run(wall.connect(servers[0].getsockname()[:2])) as tcp:
            _undo(tcp)
            with pytest.raises(PermissionError):
                tcp.bind(("127.0.0.1", port))
        with socket.create_server(("127.0.0.1", port)):
            pass  # the port is the node's still
    finally:
        wall.close()


def test_a_smith_that_died_is_started_again(servers, caplog) -> None:
    nats = servers[0].getsockname()[:2]
    wall = _wall([nats])
    try:
        wall._smith.kill()
        wall._smith.wait()
        with asyncio.run(wall.connect(nats)) as tcp:
            assert tcp.getpeername()[:2] == nats
        assert any("door smith exited" in r.getMessage() for r in caplog.records)
    finally:
        wall.close()


def test_a_fence_that_does_not_hold_is_not_used(monkeypatch) -> None:
    """The agent checks its fence once it is up: a program that lets everything through is found out."""
    monkeypatch.setattr(bpf, "peer_filter", lambda allowed, layout, families: bpf.assemble(
        [(bpf.MOV64_K, 0, 0, 0, 1), (bpf.EXIT, 0, 0, 0, 0)]))
    try:
        doorwall.DoorWall.start([("127.0.0.1", 4222)]).close()
    except doorwall.WallUnavailable as exc:
        if any(reason in str(exc) for reason in NOT_HERE) and not os.environ.get("EMBER_TEST_REQUIRE_FENCE"):
            pytest.skip(f"this node cannot fence door sockets: {exc}")
        assert "does not hold" in str(exc) and "connected" in str(exc)
    else:
        pytest.fail("a fence that lets everything through was used")


def test_a_door_makes_a_burst_of_connections_then_one_a_second(servers) -> None:
    """Each is a socket and a port of the node's: a sandbox asking on and on is refused, not let use them up; an
    ask that made none (NATS down while replicas try again) costs nothing."""
    nats = servers[0].getsockname()[:2]

    async def go(tmp: Path) -> list[str]:
        door = natsdoor.Door.open(tmp, frozenset({nats}))
        found = []
        try:
            for _ in range(natsdoor.ASK_BURST * 2):  # refused asks made no socket: they cost nothing
                with pytest.raises(ConnectionRefusedError, match="not a NATS server"):
                    await natsdoor.ask(str(door.folder / natsdoor.SOCKET_NAME), nats[0], nats[1] + 1)
            for _ in range(natsdoor.ASK_BURST + 1):
                try:
                    (await natsdoor.ask(str(door.folder / natsdoor.SOCKET_NAME), *nats)).close()
                    found.append("ok")
                except ConnectionRefusedError as exc:
                    found.append(str(exc))
        finally:
            door.stop()
        return found

    with tempfile.TemporaryDirectory() as tmp:
        found = asyncio.run(go(Path(tmp)))
    assert found[:-1] == ["ok"] * natsdoor.ASK_BURST
    assert "one a second" in found[-1]


@pytest.mark.parametrize("layout", [bpf.SKB, bpf.SOCK_ADDR])
def test_the_kernel_takes_the_filter_for_hundreds_of_servers(layout) -> None:
    """No verifier log is asked of a good program (a log longer than its buffer failed one of 82 addresses)."""
    many = frozenset({(socket.AF_INET, bytes([10, 0, i // 256, i % 256]), 4222) for i in range(300)} |
                     {(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, f"fd00::{i:x}"), 4222) for i in range(150)})
    hooks = [(bpf.CGROUP_SKB, bpf.INET_EGRESS, doorwall.BOTH)] if layout == bpf.SKB else \
        [(bpf.CGROUP_SOCK_ADDR, bpf.INET4_CONNECT, (socket.AF_INET,)),
         (bpf.CGROUP_SOCK_ADDR, bpf.INET6_CONNECT, (socket.AF_INET6,))]
    try:
        for prog_type, attach_type, families in hooks:
            os.close(bpf.load(bpf.peer_filter(many, layout, families), prog_type, attach_type))
    except bpf.BpfError as exc:
        if exc.errno == 1 and not os.environ.get("EMBER_TEST_REQUIRE_FENCE"):
            pytest.skip(f"no privilege to load a cgroup program here: {exc}")
        raise


@pytest.mark.parametrize("allowed", [
    frozenset(),
    frozenset({(socket.AF_INET, socket.inet_aton("127.0.0.1"), 4222)}),
    frozenset({(socket.AF_INET, socket.inet_aton("10.255.0.7"), 65535),  # a first byte over 127: a negative word
               (socket.AF_INET, socket.inet_aton("192.168.1.2"), 4222),
               (socket.AF_INET6, socket.inet_pton(socket.AF_INET6, "fd00::ffff:1"), 4222),
               (socket.AF_INET6, socket.inet_pton(socket.AF_INET6, "::1"), 1)}),
])
def test_the_kernel_takes_the_filter_for_any_set_of_servers(allowed) -> None:
    for prog_type, attach_type, families in doorwall.HOOKS:
        layout = bpf.SKB if prog_type == bpf.CGROUP_SKB else bpf.SOCK_ADDR
        try:
            os.close(bpf.load(bpf.peer_filter(allowed, layout, families), prog_type, attach_type))
        except bpf.BpfError as exc:
            if exc.errno == 1 and not os.environ.get("EMBER_TEST_REQUIRE_FENCE"):
                pytest.skip(f"no privilege to load a cgroup program here: {exc}")
            raise


def test_the_groups_of_agents_gone_are_swept(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (tmp_path / f"{doorwall.GROUP_PREFIX}{dead}").mkdir()
    (tmp_path / f"{doorwall.GROUP_PREFIX}{os.getpid()}").mkdir()  # this agent's
    (tmp_path / f"{doorwall.GROUP_PREFIX}1").mkdir()  # a running process's
    (tmp_path / "other").mkdir()
    assert doorwall.sweep(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{doorwall.GROUP_PREFIX}{os.getpid()}", f"{doorwall.GROUP_PREFIX}1", "other"])


def test_a_node_that_cannot_fence_says_so(monkeypatch, caplog) -> None:
    monkeypatch.setattr(cgroups, "cgroup2_mount", lambda: None)
    with pytest.raises(doorwall.WallUnavailable, match="no cgroup v2"):
        doorwall.DoorWall.start([("127.0.0.1", 4222)])
    network = netns.for_node("/usr/bin/pasta", "nats://127.0.0.1:4222", {})
    assert network.wall is None and "no cgroup v2" in network.wall_why_not
    assert any("can be pointed at any port" in r.getMessage() for r in caplog.records)
    box = sandbox.Sandbox("/usr/bin/bwrap", network=network)
    (note,) = sandbox.isolation(box, None)["isolation_notes"]
    assert "NATS socket can be pointed at any port" in note and "no cgroup v2" in note
