"""Each sandbox's own network (bwrap's ``--unshare-net`` with pasta attached): a real sandbox reaches the
forwarded NATS port and nothing else of the node's loopback, reaches out unless its function blocks it, and its
pasta ends with it. Where pasta is missing the node says so, in its status as in its log."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from support.listeners import accepting
from support.polling import wait_for
from support.procs import gone

import ember
from ember_runtime.agent import netns, sandbox
from ember_runtime.agent.cgroups import MemoryCgroups, decide
from ember_runtime.agent.leaders import Leader
from ember_runtime.agent.sandbox import Jail, Sandbox, environment

OUTSIDE = ("203.0.113.1", 9)  # TEST-NET-3: out on the internet, where nothing answers

REACH = """
import ctypes, errno, json, os, socket, struct, sys
def door(port):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(os.environ["EMBER_NATS_DOOR"])
        s.sendall(f"127.0.0.1 {port}".encode())
        words, fds, _, _ = socket.recv_fds(s, 512, 1)
    for fd in fds:
        os.close(fd)
    return "ok" if fds else words.decode()
def turn(nats, port):
    # a socket from the door, connected to NATS, disconnected (AF_UNSPEC) and connected to port
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(os.environ["EMBER_NATS_DOOR"])
        s.sendall(f"127.0.0.1 {nats}".encode())
        words, fds, _, _ = socket.recv_fds(s, 512, 1)
    if not fds:
        return words.decode()
    with socket.socket(fileno=fds[0]) as tcp:
        unspec = struct.pack("@H14x", socket.AF_UNSPEC)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.connect(tcp.fileno(), unspec, len(unspec)) != 0:
            return "undo " + errno.errorcode.get(ctypes.get_errno(), "?")
        tcp.settimeout(3)
        tcp.connect(("127.0.0.1", port))
        return "ok"
def reach(host, port):
    try:
        if host == "door":  # NATS through the sandbox's door: a socket the agent connected
            return door(port)
        if host.startswith("turn"):  # a door's socket pointed elsewhere: "turn:<nats port>"
            return turn(int(host.split(":")[1]), port)
        with socket.create_connection((host, port), timeout=3):
            return "ok"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
print(json.dumps([reach(h, p) for h, p in json.loads(sys.argv[1])]))
"""


@pytest.fixture
def servers() -> Iterator[tuple[int, int]]:
    """Two servers on the node's loopback: one stands for NATS (forwarded), the other for any other service."""
    nats, other = accepting(), accepting()
    yield nats.getsockname()[1], other.getsockname()[1]
    nats.close()
    other.close()


@pytest.fixture
def networked(node_sandbox: Sandbox, servers: tuple[int, int]) -> Iterator[Sandbox]:
    if netns.find_pasta() is None:
        pytest.skip("pasta is not installed (Debian's passt package)")
    found = node_sandbox.with_network(f"nats://127.0.0.1:{servers[0]}")
    if found.network is None:
        pytest.skip(f"pasta cannot give a sandbox its own network here: {found.network_why_not}")
    yield found
    found.network.close()


def _ours() -> Path:
    """This process's folder of pasta pid files and doors (the agent's, here the test's)."""
    return netns.RUN_ROOT / str(os.getpid())


def _pastas() -> set[str]:
    """The pids of the pastas this process started: their pid file, in its folder, is on their command line."""
    marker = f"--pid {_ours()}/".encode()
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "):
                found.add(pid)
    return found


def _doors() -> set[Path]:
    return set(_ours().glob("door-*"))


async def _ended(pastas: set[str], doors: set[Path]) -> None:
    """Wait, the loop still running (it sees the sandbox's first process exit), until none of ``pastas`` and
    none of ``doors`` is left."""
    await asyncio.to_thread(wait_for, lambda: not (_pastas() & pastas), timeout_s=30,
                            what="pasta to end once its sandbox did")
    await asyncio.to_thread(wait_for, lambda: not (_doors() & doors), timeout_s=30,
                            what="the sandbox's door to go with it")


def _reach(box: Sandbox, targets: list[tuple[str, int]], *, blocked: bool = False) -> list[str]:
    """What the sandbox's connections to ``targets`` gave; its pasta and door have ended when this returns."""
    async def go() -> bytes:
        before = (_pastas(), _doors())
        proc = await sandbox.start(box, [sys.executable, "-c", REACH, json.dumps(targets)],
                                   Jail(bundle=Path(os.environ.get("TMPDIR", "/tmp")), block_network=blocked),
                                   environment({}, sandboxed=True), partial(sandbox.prepare_child, None))
        started = (_pastas() - before[0], _doors() - before[1])
        assert started[1] or not box.own_network_for(Jail(bundle=Path("/tmp"), block_network=blocked))
        assert proc.stdout is not None
        out = await asyncio.wait_for(proc.stdout.read(), 60)
        assert await proc.wait() == 0
        await _ended(*started)
        return out

    return list(json.loads(asyncio.run(go())))


def test_a_sandbox_reaches_nats_through_its_door_and_no_port_of_the_node(networked, servers) -> None:
    """A sandbox started with no network option: its own namespace; NATS only through its door, which connects
    to NATS' servers and refuses any other port of the node."""
    nats, other = servers
    found = _reach(networked, [("door", nats), ("127.0.0.1", nats), ("127.0.0.1", other), ("door", other)])
    assert found[:3] == ["ok", "ECONNREFUSED", "ECONNREFUSED"]
    assert found[3].startswith("no ") and "not a NATS server" in found[3]
    with socket.create_connection(("127.0.0.1", other), timeout=10):
        pass  # the node itself reaches it


def test_a_door_socket_pointed_elsewhere_reaches_nothing(networked, servers) -> None:
    """The door's socket, disconnected and connected again to another port of the node (which the agent reaches),
    sends nothing: it was made in the door smith's cgroup, whose filter passes packets to NATS' servers only."""
    assert networked.network is not None
    if networked.network.wall is None and not os.environ.get("EMBER_TEST_REQUIRE_FENCE"):
        pytest.skip(f"this node cannot fence door sockets: {networked.network.wall_why_not}")
    nats, other = servers
    found = _reach(networked, [("door", nats), (f"turn:{nats}", other), (f"turn:{nats}", nats)])
    assert found[0] == "ok"
    assert found[1] == "EPERM", found  # connected to the other port before the fence
    assert found[2] == "ok"  # back to NATS, it is let through
    assert not sandbox.isolation(networked, None)["isolation_notes"]


def test_block_network_leaves_nats_and_no_way_out(networked, servers) -> None:
    nats, _ = servers
    opened = _reach(networked, [("door", nats), OUTSIDE])
    sealed = _reach(networked, [("door", nats), OUTSIDE], blocked=True)
    assert opened[0] == sealed[0] == "ok"
    assert sealed[1] == "ENETUNREACH" and opened[1] != "ENETUNREACH"


def test_by_default_only_block_network_sandboxes_get_a_network_of_their_own(networked, servers) -> None:
    """``--sandbox-network node`` (the opt-out): a sandbox shares the node's network (it reaches the node's
    other port), except a ``block_network=True`` function's, which gets its own (NATS only)."""
    nats, other = servers
    shared = dataclasses.replace(networked, own_for_all=False)
    assert _reach(shared, [("127.0.0.1", nats), ("127.0.0.1", other)]) == ["ok", "ok"]
    assert _reach(shared, [("door", nats), ("127.0.0.1", other)], blocked=True) == ["ok", "ECONNREFUSED"]
    status = sandbox.isolation(shared, None)
    assert status["sandbox"] == "bwrap, node network (own with block_network)"
    assert any("--sandbox-network node" in note for note in status["isolation_notes"])


def test_pasta_ends_with_its_sandbox(networked, servers) -> None:
    """Its pasta and its door run while the sandbox does and end with it (``_reach`` waits for that), leaving
    nothing behind."""
    seen: list[tuple[set[str], set[Path]]] = []
    hold = "import time; print('up', flush=True); time.sleep(600)"

    async def go() -> None:
        before = (_pastas(), _doors())
        proc = await sandbox.start(networked, [sys.executable, "-c", hold], Jail(bundle=Path("/tmp")),
                                   environment({}, sandboxed=True), partial(sandbox.prepare_child, None))
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"up\n"
        seen.append((_pastas() - before[0], _doors() - before[1]))
        proc.send_signal(signal.SIGKILL)  # its whole group: the way the agent ends a replica
        await proc.wait()
        await _ended(*seen[0])

    asyncio.run(go())
    assert len(seen[0][0]) == 1 and len(seen[0][1]) == 1  # while it ran: one pasta, one door


def test_a_sandboxs_door_is_its_own(networked, servers) -> None:
    """Each sandbox sees its own door's folder alone: not the agent's folder of doors, not another's door."""
    look = ("import json, os; d = os.environ['EMBER_NATS_DOOR']; print(json.dumps([d, os.listdir(os.path.dirname(d)),"
            f" os.path.exists({str(netns.RUN_ROOT)!r}), os.stat(d).st_ino]))")

    async def both() -> list[bytes]:
        before = _doors()
        procs, theirs = [], set()
        for _ in range(2):
            procs.append(await sandbox.start(networked, [sys.executable, "-c", look], Jail(bundle=Path("/tmp")),
                                             environment({}, sandboxed=True), partial(sandbox.prepare_child, None)))
            theirs |= _doors() - before
        outs = []
        for proc in procs:
            assert proc.stdout is not None and proc.stderr is not None
            outs.append(await asyncio.wait_for(proc.stdout.read(), 60))
            assert await proc.wait() == 0, await proc.stderr.read()
        await _ended(set(), theirs)
        return outs

    seen = [json.loads(out) for out in asyncio.run(both())]
    for door, listed, sees_the_agents_folder, _ in seen:
        assert listed == ["nats.sock"] and not sees_the_agents_folder and door.startswith("/run/ember-nats/")
    assert seen[0][3] != seen[1][3]  # two sockets: each sandbox its own


def test_without_pasta_sandboxes_share_the_nodes_network_and_the_node_says_so(node_sandbox, monkeypatch) -> None:
    monkeypatch.setattr(netns, "find_pasta", lambda: None)
    shared = node_sandbox.with_network("nats://127.0.0.1:4222")
    assert shared.enabled and not shared.own_network
    status = sandbox.isolation(shared, None)
    assert status["sandbox"] == "bwrap, node network"
    assert any("share the node's network" in note and "passt" in note for note in status["isolation_notes"])
    assert "--share-net" in shared.argv(["true"], Jail(bundle=Path("/tmp")))


def test_an_unsandboxed_node_and_one_without_process_limits_say_so() -> None:
    bare = Sandbox(None, why_not="bwrap not found")
    groups = MemoryCgroups(decide(None, "", "", "", True))
    status = sandbox.isolation(bare, groups)
    assert status["sandbox"] == "none"
    assert any("UNSANDBOXED" in note and "bwrap not found" in note for note in status["isolation_notes"])
    assert any("RLIMIT_NPROC" in note for note in status["isolation_notes"])


def test_process_limits_need_the_pids_controller_of_a_delegated_cgroup_v2() -> None:
    mount = Path("/sys/fs/cgroup")
    both = decide(mount, "/system.slice/ember.service", "cpu memory pids", "memory pids", True)
    assert both.pids and not both.move_agent
    first = decide(mount, "/system.slice/ember.service", "cpu memory pids", "cpu", True)
    assert first.pids and first.move_agent  # the agent leaves for a leaf, then children get memory and pids
    assert not decide(mount, "/user.slice/ember", "cpu memory", "memory", True).pids
    assert MemoryCgroups(both).pids and not MemoryCgroups(decide(None, "", "", "", True)).pids


def test_only_a_nats_url_on_the_nodes_loopback_is_forwarded() -> None:
    assert netns.loopback_port("nats://127.0.0.1:4333") == 4333
    assert netns.loopback_port("nats://localhost") == netns.NATS_DEFAULT_PORT
    assert netns.loopback_port("tls://[::1]:4222,nats://10.0.0.2:4222") == 4222
    assert netns.loopback_port("nats://nats.ember.svc:4222") == 0
    assert netns.loopback_port("nats://10.0.0.2:4222") == 0
    # a cluster's servers: each is forwarded, so that a replica reconnects to another when one is lost
    assert netns.loopback_ports("nats://127.0.0.1:4301,nats://127.0.0.1:4302, nats://localhost:4303") == (
        4301, 4302, 4303)
    assert netns.loopback_ports("nats://127.0.0.1:4301,nats://10.0.0.2:4222") == (4301,)
    network = netns.Network("pasta", 4301, nats_ports=(4301, 4302, 4303))
    assert network.argv(7, blocked=True)[network.argv(7, blocked=True).index("-T") + 1] == "4301,4302,4303"
    network = netns.for_node("/usr/bin/pasta", "nats://127.0.0.1:4333",
                             {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    argv = network.argv(42, blocked=False)
    assert argv[-1] == "42" and "--config-net" in argv
    assert {"-t", "-u", "-U", "--no-map-gw"} <= set(argv) and argv[argv.index("-t") + 1] == "none"
    assert argv[argv.index("-T") + 1] == "4318"  # NATS goes through each sandbox's door, not through pasta
    assert network.nats_servers == {("127.0.0.1", 4333)}
    assert "--config-net" not in network.argv(42, blocked=True)  # no address, no route: NATS only
    network.close()
    remote = netns.for_node("/usr/bin/pasta", "nats://10.0.0.2:4222", {})
    assert "--config-net" not in remote.argv(42, blocked=True)  # NATS out there is reached through the door too
    remote.close()


def test_block_network_is_a_flag_of_the_service_spec_checked_at_decoration() -> None:
    app = ember.App("sealed")

    @app.function(block_network=True)
    def f() -> int:
        return 1

    @app.model(block_network=False)
    class M:
        @ember.method
        def g(self) -> int:
            return 1

    assert app.services["f"].block_network is True and app.services["M"].block_network is False
    with pytest.raises(ember.InvalidSpecError, match=r"@app\.function\(block_network='yes'\): True or False"):
        app.function(block_network="yes")  # type: ignore[arg-type]


def test_the_nodes_own_addresses_are_unreachable_from_a_sandbox_and_others_are_not(networked) -> None:
    """As the node's other addresses (a Docker bridge's) would be: pasta would reach them as any address out there."""
    assert networked.network is not None
    mine = dataclasses.replace(networked.network, node_addresses=("203.0.113.1", "2001:db8::1"))
    box = dataclasses.replace(networked, network=mine)
    reached = _reach(box, [("203.0.113.1", 9), ("203.0.113.2", 9)])
    assert reached[0] in ("EHOSTUNREACH", "ENETUNREACH") and reached[1] not in ("EHOSTUNREACH", "ENETUNREACH")


def test_the_nodes_addresses_are_read_from_proc_loopback_and_link_local_aside(tmp_path: Path) -> None:
    (tmp_path / "fib_trie").write_text("Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 127.0.0.1\n        /32 host LOCAL\n"
                                       "     |-- 172.17.0.1\n        /32 host LOCAL\n     |-- 172.17.255.255\n"
                                       "        /32 link BROADCAST\n")
    (tmp_path / "if_inet6").write_text("00000000000000000000000000000001 01 80 10 80       lo\n"
                                       "fd000000000000000000000000000002 04 40 00 82     eth0\n"
                                       "fe8000000000000000fc00fffe000001 04 40 20 80     eth0\n")
    assert netns.node_addresses(tmp_path / "fib_trie", tmp_path / "if_inet6") == ("172.17.0.1", "fd00::2")


KILLED_AGENT = """
import asyncio, os, signal, sys
from functools import partial
from pathlib import Path
from ember_runtime.agent import sandbox
box = sandbox.Sandbox.for_node("required", sys.argv[1])
print(os.getpid(), flush=True)
async def go():
    await sandbox.start(box, ["true"], sandbox.Jail(bundle=Path("/tmp")),
                        sandbox.environment({}, sandboxed=True), partial(sandbox.prepare_child, None))
    os.kill(os.getpid(), signal.SIGKILL)  # killed outright: no exit handler runs
asyncio.run(go())
"""



def test_the_pastas_of_an_agent_killed_outright_are_stopped_by_the_next_agent(networked, servers) -> None:
    killed = subprocess.run([sys.executable, "-c", KILLED_AGENT, f"nats://127.0.0.1:{servers[0]}"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = (netns.RUN_ROOT / killed.stdout.split()[0]).iterdir()
    (pid_file,) = (p for p in left if p.is_file())  # its pasta's, left with the pasta (and its sandbox's door)
    pasta = int(pid_file.read_text())
    assert Path(f"/proc/{pasta}").exists()
    # once its sandbox has ended too (it dies with the agent, a few milliseconds later): a sandbox still running
    # keeps its pasta (see the next test)
    wait_for(lambda: netns.sweep() >= 0 and not (netns.RUN_ROOT / killed.stdout.split()[0]).exists(), timeout_s=30,
             what="the sweep to stop the pasta")  # another test's may be among those it stops
    wait_for(lambda: gone(pasta), timeout_s=30, what="the orphaned pasta to be stopped")
    assert not (netns.RUN_ROOT / killed.stdout.split()[0]).exists()


OUTLIVED_AGENT = KILLED_AGENT.replace(
    '["true"], sandbox.Jail(bundle=Path("/tmp"))',
    '["sleep", "60"], sandbox.Jail(bundle=Path("/tmp"), outlive_command=True)',
).replace("partial(sandbox.prepare_child, None)", "partial(sandbox.prepare_child, None, outlive_agent=True)")


def test_a_killed_agents_pasta_stays_while_its_sandbox_runs(networked, servers) -> None:
    """A replica outlives its agent, to be adopted by the next one: another agent's sweep meanwhile leaves its pasta
    and its door; once the sandbox has ended, the sweep stops them."""
    assert OUTLIVED_AGENT != KILLED_AGENT
    killed = subprocess.run([sys.executable, "-c", OUTLIVED_AGENT, f"nats://127.0.0.1:{servers[0]}"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    folder = netns.RUN_ROOT / killed.stdout.split()[0]
    (pid_file,) = (p for p in folder.iterdir() if p.is_file())
    (door,) = (p for p in folder.iterdir() if p.is_dir())
    pasta = int(pid_file.read_text())
    sandbox_init = Leader.open(int(Path(f"/proc/{pasta}/cmdline").read_bytes().split(b"\0")[-4]))  # PID --pid ...
    try:
        netns.sweep()
        assert Path(f"/proc/{pasta}").exists() and pid_file.exists() and door.is_dir()
    finally:
        sandbox_init.kill()  # through a pidfd: by its number, a group that took it after the sandbox ended would go
        sandbox_init.close()
    wait_for(lambda: netns.sweep() >= 0 and not folder.exists(), timeout_s=30,
             what="the sweep to stop the pasta once the sandbox ended")


def test_a_sandboxs_door_lasts_while_any_of_its_processes_does(networked, servers) -> None:
    """A zygote's command ends before the replicas it forked (bwrap exits with it): the sandbox's door and way out
    stay until its last process ends, so that those replicas still reach NATS (a reconnect, a renewal)."""
    targets = shlex.quote(json.dumps([["door", servers[0]]]))
    later = f"sleep 1.5; exec {sys.executable} -c {shlex.quote(REACH)} {targets}"

    async def go() -> tuple[int, bytes]:
        before = (_pastas(), _doors())
        proc = await sandbox.start(networked, ["sh", "-c", f"({later}) & exit 0"],
                                   Jail(bundle=Path("/tmp"), outlive_command=True),
                                   environment({}, sandboxed=True), partial(sandbox.prepare_child, None))
        started = (_pastas() - before[0], _doors() - before[1])
        assert proc.stdout is not None
        code = await asyncio.wait_for(proc.wait(), 60)  # bwrap: at once, with its command
        out = await asyncio.wait_for(proc.stdout.read(), 60)  # the background process's, 1.5 s later
        await _ended(*started)  # and then they go
        return code, out

    code, out = asyncio.run(go())
    assert code == 0 and json.loads(out) == ["ok"], out


def test_the_node_says_its_sandboxes_reach_nats_through_their_doors(node_sandbox, servers, caplog) -> None:
    """The agent's start line names the way a sandbox reaches NATS: its door, to NATS' servers (before, it said
    "forwarded from port N", which pasta no longer does)."""
    if netns.find_pasta() is None:
        pytest.skip("pasta is not installed (Debian's passt package)")
    caplog.set_level(logging.INFO, logger=sandbox.log.name)
    found = node_sandbox.with_network(f"nats://127.0.0.1:{servers[0]}")
    if found.network is None:
        pytest.skip(f"pasta cannot give a sandbox its own network here: {found.network_why_not}")
    found.network.close()
    (line,) = [r.getMessage() for r in caplog.records if "a network of its own" in r.getMessage()]
    assert f"NATS through each sandbox's door, to 127.0.0.1:{servers[0]}" in line and "forwarded" not in line
