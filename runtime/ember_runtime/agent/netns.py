"""A network of its own for each sandbox: bwrap's ``--unshare-net`` and Debian's ``pasta`` (package ``passt``).

A sandbox gets a network namespace of its own: its own loopback, no other interface. Every sandbox does, unless
the agent is told ``--sandbox-network node``. Once bwrap has made it (and before the command runs: bwrap waits on
its ``--block-fd``), the agent attaches ``pasta`` to it, which gives the namespace user-mode networking from
outside, without privileges:

- NATS is reached through the sandbox's own door (``natsdoor``: a unix socket in a folder bound into that sandbox
  alone, where the agent hands the replica a TCP socket it connected to one of NATS' servers), not through pasta:
  pasta's splice stalled calls under load (bench/RESULTS.md). Those sockets are made in a cgroup whose programs let
  them reach NATS' servers only (``doorwall``), where the node allows it: pointed elsewhere, they reach nothing.
  Nothing of the node's loopback is reachable (the platform's HTTP port, NATS' own ports, monitoring and cluster
  ones, other replicas' servers). No port of the node reaches in (``-t none -u none``).
- So is the OpenTelemetry collector the agent's environment names (``OTEL_EXPORTER_OTLP_ENDPOINT``), when it
  listens on this node's loopback: replicas export their spans where the control plane does.
- Outbound connections go out through pasta's sockets (model code downloads weights); the namespace takes the
  node's own address, so that address reaches the namespace itself, not the node's services. The gateway is not
  mapped to the node's loopback (``--no-map-gw``). The node's other addresses (a Docker bridge's, a second
  interface's), which pasta would reach as any address out there, are made unreachable in the namespace
  (``ip route add unreachable``, run by the agent in the sandbox's namespaces, which its user owns), and so are
  the clouds' metadata services (``NEVER_REACHED``: a node's credentials, answered to any process on it).
- ``block_network=True``: no pasta at all (or one forwarding the collector alone, configuring nothing): the
  namespace has no route out; NATS, on this node or elsewhere, through the door.
- A NATS URL without a door (``Network`` built without ``nats_servers``): pasta forwards its loopback ports.

pasta (a daemon once attached) holds the namespace; it does not notice the sandbox's end by itself: the agent
stops it when the sandbox's first process (bwrap's init, the last to end) exits, not bwrap (which exits with its
command, before the replicas a zygote forked), and every one left when it exits itself; the pastas
of an agent killed outright are found by their pid files (``RUN_ROOT``) and stopped by the next agent's start,
but those of its replicas that still run: the next agent adopts them with their pastas and doors (``readopt``,
see ``adoption``). A zygote's sandbox pays this once; its forked replicas share the zygote's namespace (one
version's replicas, one app).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import ipaddress
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ember_runtime import natsdoor, pidwatch
from ember_runtime.agent import doorwall

log = logging.getLogger("ember.agent")
ATTACH_TIMEOUT_S = 30.0  # pasta attaches in tens of milliseconds; a loaded node may take longer
NATS_DEFAULT_PORT = 4222
OTLP_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
OTLP_DEFAULT_PORT = 4318  # OTLP over HTTP
J = TypeVar("J", bound=Any)  # a sandbox's Jail (its ``mounts``)
RUN_ROOT = Path(tempfile.gettempdir()) / f"ember-pasta-{os.getuid()}"  # <agent pid>/<pasta's pid file>


class NetworkUnavailable(RuntimeError):
    """pasta is missing, or cannot attach to a sandbox's network namespace here."""


@dataclass(frozen=True)
class Network:
    """How this node gives each sandbox its own network: pasta, and the NATS port it forwards (0: none, NATS is
    not on this node's loopback and is reached outbound)."""

    pasta: str
    nats_port: int = 0
    also: tuple[int, ...] = ()  # other ports of the node's loopback forwarded: an OpenTelemetry collector's
    node_addresses: tuple[str, ...] = ()  # this node's own addresses (not loopback): unreachable from inside
    nats_ports: tuple[int, ...] = ()  # every loopback port of the NATS URL's servers (a cluster's), forwarded too
    nats_servers: frozenset[tuple[str, int]] = frozenset()  # what a sandbox's door connects to (``natsdoor``)
    wall: doorwall.DoorWall | None = field(default=None, compare=False, repr=False)  # makes the doors' sockets
    wall_why_not: str = ""  # why the doors' sockets are not fenced (``doorwall``), when they are not

    async def connect(self, server: tuple[str, int]) -> Any:
        """A socket connected to NATS server ``server`` for a sandbox's door: fenced where the node allows it."""
        return await (self.wall.connect(server) if self.wall is not None else natsdoor.plain(server))

    def notes(self) -> list[str]:
        """What this network lacks, for the node's status."""
        return [f"a sandbox's NATS socket can be pointed at any port the agent reaches (its filter is off: "
                f"{self.wall_why_not})"] if self.wall_why_not else []

    def close(self) -> None:
        """Stop what this network holds for the node (the door smith); the doors' sockets stay fenced."""
        if self.wall is not None:
            self.wall.close()

    def argv(self, pid: int, *, blocked: bool) -> list[str]:
        """pasta's command line for the sandbox whose first process is ``pid``."""
        forwarded = {*self.also} if self.nats_servers else {self.nats_port, *self.nats_ports, *self.also}
        args = [self.pasta, "--quiet", "-t", "none", "-u", "none", "-U", "none", "--no-map-gw",
                "-T", ",".join(str(p) for p in sorted(forwarded - {0})) or "none"]
        if os.geteuid() == 0:  # as root pasta would become nobody, who may not enter the sandbox's namespaces
            args += ["--runas", "0"]
        if not blocked:
            args.append("--config-net")  # an address, a default route: the way out
        return [*args, str(pid)]


def for_node(pasta: str, nats_url: str, env: Mapping[str, str]) -> Network:
    """What this node's sandboxes get forwarded: NATS, and an OpenTelemetry collector, where on its loopback."""
    otlp = {loopback_port(env[k], OTLP_DEFAULT_PORT) for k in OTLP_ENV if env.get(k, "").strip()}
    servers = natsdoor.servers_of(nats_url)
    wall, why_not = None, ""
    if servers:
        try:
            wall = doorwall.DoorWall.start(servers)
        except doorwall.WallUnavailable as exc:
            why_not = str(exc)
            log.warning("a sandbox's NATS socket can be pointed at any port the agent reaches: %s", why_not)
    return Network(pasta, loopback_port(nats_url), tuple(sorted(otlp - {0})), node_addresses(),
                   nats_ports=loopback_ports(nats_url), nats_servers=servers, wall=wall, wall_why_not=why_not)


def with_door(network: Network | None, jail: J, env: dict[str, str]) -> tuple[J, dict[str, str], natsdoor.Door | None]:
    """A sandbox's jail and environment with a door to NATS of its own (``natsdoor``: a folder of its own under
    this agent's ``RUN_ROOT`` folder, bound into it alone), when it has a network of its own (``network``)."""
    if network is None or not network.nats_servers:
        return jail, env, None
    door = natsdoor.Door.open(_run_dir(), network.nats_servers, network.connect)
    mounts = (*jail.mounts, (door.folder, natsdoor.DOOR))
    return dataclasses.replace(jail, mounts=mounts), {**env, **door.env}, door


def stop(*held: Pasta | natsdoor.Door | None) -> None:
    for each in held:
        if each is not None:
            each.stop()


def stop_after(pid: int, *held: Pasta | natsdoor.Door | None) -> None:
    """Stop each of ``held`` once process ``pid`` (the sandbox's first process: its last to end) exits."""
    for each in held:
        if each is not None:
            each.stop_after(pid)


# What a sandbox never reaches, whatever its network: link-local IPv4 (the metadata services of the clouds,
# 169.254.169.254, which answer a node's credentials to whoever asks from it: pasta's connections are the node's),
# and the other metadata and host addresses clouds give (Alibaba's, Azure's host, AWS's over IPv6).
NEVER_REACHED = ("169.254.0.0/16", "100.100.100.200", "168.63.129.16", "fd00:ec2::254")


def node_addresses(fib_trie: Path = Path("/proc/net/fib_trie"),
                   inet6: Path = Path("/proc/net/if_inet6")) -> tuple[str, ...]:
    """This node's own IPv4 and global IPv6 addresses, loopback ones aside: what a sandbox must not reach through
    pasta's way out (where a service listening on every address would answer)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        lines = fib_trie.read_text().splitlines()
        found |= {prev.split()[-1] for prev, line in itertools.pairwise(lines) if line.strip() == "/32 host LOCAL"}
    with contextlib.suppress(OSError):
        for line in inet6.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 4 and fields[3] == "00":  # global scope (not link-local, not loopback)
                found.add(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return tuple(sorted(a for a in found if not ipaddress.ip_address(a).is_loopback))


def unroute(addresses: tuple[str, ...], pid: int) -> None:
    """Make ``addresses`` unreachable from the network namespace of ``pid`` (one ``ip -batch`` run there)."""
    nsenter, ip = shutil.which("nsenter"), shutil.which("ip")
    if not addresses:
        return
    if nsenter is None or ip is None:
        raise NetworkUnavailable("nsenter (util-linux) and ip (iproute2) are needed to keep the node's own "
                                 "addresses out of a sandbox's reach")
    own_userns = os.readlink("/proc/self/ns/user") == os.readlink(f"/proc/{pid}/ns/user")
    argv = [nsenter, "--target", str(pid), "--net", *([] if own_userns else ["--user", "--preserve-credentials"]),
            ip, "-batch", "-"]
    routes = "".join(f"route add unreachable {ipaddress.ip_network(a)}\n" for a in addresses)  # 1.2.3.4: a /32
    done = subprocess.run(argv, input=routes.encode(), capture_output=True, timeout=ATTACH_TIMEOUT_S, check=False)
    if done.returncode:
        raise NetworkUnavailable(f"cannot keep the node's addresses out of reach: {done.stderr.decode()[-300:]}")


def loopback_ports(urls: str) -> tuple[int, ...]:
    """The loopback ports of every server in a comma-separated NATS URL list: a replica must reach each of a
    cluster's servers, or it cannot reconnect when the one it uses is lost."""
    return tuple(sorted({port for url in urls.split(",") if (port := loopback_port(url))}))


def loopback_port(url: str, default: int = NATS_DEFAULT_PORT) -> int:
    """The port of a URL whose host is this node's loopback (the one to forward); 0 for any other host."""
    first = url.split(",")[0].strip()
    parts = urlsplit(first if "://" in first else f"nats://{first}")
    host = parts.hostname or ""
    if host != "localhost":
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return 0
        except ValueError:
            return 0
    try:
        return parts.port or default
    except ValueError:
        return 0


class Pasta:
    """One attached pasta daemon, held by a pidfd (its pid may be reused once it is gone)."""

    def __init__(self, pidfd: int, pid_file: str) -> None:
        self._pidfd = pidfd
        self.pid_file = pid_file  # kept while it runs: how a later agent finds it if this one is killed
        _LIVE.add(self)

    @classmethod
    def from_pid_file(cls, path: str) -> Pasta | None:
        """The pasta started with ``path``, which wrote its pid there; None if it is gone."""
        with contextlib.suppress(OSError, ValueError), open(path) as f:
            pidfd = os.pidfd_open(int(f.read().strip()))
            if _is_pasta_of(Path(path)):  # checked once the pidfd is open: the pidfd is the process checked
                return cls(pidfd, path)
            os.close(pidfd)
        return None

    def stop_after(self, pid: int) -> None:
        """Stop once process ``pid`` (alive when this is called: no reuse of its number) exits, seen by the loop."""
        pidwatch.when_exits(pid, self.stop)

    def stop(self) -> None:
        if self._pidfd < 0:
            return
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        os.close(self._pidfd)
        self._pidfd = -1
        _LIVE.discard(self)
        with contextlib.suppress(OSError):
            os.unlink(self.pid_file)


_LIVE: set[Pasta] = set()  # stopped when the agent exits cleanly (its replicas stopped first)


@atexit.register
def _stop_all() -> None:
    for pasta in list(_LIVE):
        pasta.stop()
    with contextlib.suppress(OSError):
        (RUN_ROOT / str(os.getpid())).rmdir()


def find_pasta() -> str | None:
    return shutil.which("pasta")


async def attach(network: Network, pid: int, *, blocked: bool) -> Pasta | None:
    """Attach pasta to the namespace of sandbox process ``pid`` (waiting on bwrap's block fd); raise
    NetworkUnavailable with pasta's words when it cannot. pasta forks into the background once attached, and
    the daemon keeps its stderr: pasta's words go to a file, never to a pipe read to its end. None: a blocked
    sandbox whose NATS goes through its door needs no pasta (nothing forwarded, no way out)."""
    if blocked and network.nats_servers and not network.also:
        return None
    with _pid_file() as pid_file, tempfile.TemporaryFile() as err:
        proc = await asyncio.create_subprocess_exec(*network.argv(pid, blocked=blocked), "--pid", pid_file,
                                                    stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=err)
        try:
            code = await asyncio.wait_for(proc.wait(), ATTACH_TIMEOUT_S)
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            _stop(pid_file)
            raise
        err.seek(0)
        pasta = _attached(code, err.read(), pid_file)
    await asyncio.to_thread(_unroute_or_stop, network, pasta, pid, blocked)
    return pasta


def attach_sync(network: Network, pid: int, *, blocked: bool) -> Pasta:
    """``attach`` for the probe at the agent's start (no event loop yet)."""
    with _pid_file() as pid_file, tempfile.TemporaryFile() as err:
        try:
            done = subprocess.run([*network.argv(pid, blocked=blocked), "--pid", pid_file], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=err, timeout=ATTACH_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _stop(pid_file)
            raise NetworkUnavailable(f"pasta could not run: {exc}") from exc
        err.seek(0)
        pasta = _attached(done.returncode, err.read(), pid_file)
    _unroute_or_stop(network, pasta, pid, blocked)
    return pasta


@contextlib.contextmanager
def _pid_file() -> Iterator[str]:
    """A pid file for one pasta, in this agent's own folder of ``RUN_ROOT``; removed unless a pasta runs."""
    fd, path = tempfile.mkstemp(prefix="pasta-", dir=_run_dir())
    os.close(fd)
    try:
        yield path
    finally:
        if not any(p.pid_file == path for p in _LIVE):
            with contextlib.suppress(OSError):
                os.unlink(path)


def _run_dir() -> Path:
    RUN_ROOT.mkdir(mode=0o700, exist_ok=True)
    if RUN_ROOT.lstat().st_uid != os.getuid() or RUN_ROOT.is_symlink():
        raise NetworkUnavailable(f"{RUN_ROOT} is not this user's own folder")
    mine = RUN_ROOT / str(os.getpid())
    mine.mkdir(mode=0o700, exist_ok=True)
    return mine


def sweep(keep: frozenset[str] = frozenset()) -> int:
    """Stop the pastas of agents that are gone (killed outright): each is known by its pid file, named on its
    command line. Left alone: those in ``keep`` (pid files and doors of this node's replicas that outlived their
    agent, to be adopted), and a gone agent's pastas whose sandbox still runs, with its doors (another agent of this
    machine may be starting while that agent is restarted: its replicas are its own to adopt). How many were
    stopped."""
    stopped = 0
    with contextlib.suppress(OSError):
        if RUN_ROOT.is_symlink() or RUN_ROOT.lstat().st_uid != os.getuid():
            return 0
        for folder in RUN_ROOT.iterdir():
            if not folder.name.isdigit() or Path(f"/proc/{folder.name}").exists():
                continue  # an agent still running
            held = [p for p in folder.iterdir() if not p.is_dir() and (str(p) in keep or _sandbox_runs(p))]
            for pid_file in folder.iterdir():
                if str(pid_file) in keep or pid_file in held or (pid_file.is_dir() and held):
                    continue
                if pid_file.is_dir():  # a sandbox's NATS door
                    natsdoor.remove(pid_file)
                    continue
                stopped += _stop_orphan(pid_file)
            with contextlib.suppress(OSError):
                folder.rmdir()
    return stopped


def _sandbox_runs(pid_file: Path) -> bool:
    """Whether the pasta ``pid_file`` names runs, attached to a sandbox that still runs (its last argument)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text().strip() or 0)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if pid and str(pid_file).encode() in argv:
            target = next((a for a in reversed(argv) if a.isdigit()), b"0")
            return Path(f"/proc/{int(target)}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    return False


def readopt(pid: int, pid_file: str, door: str, network: Network | None) -> None:
    """Hold again the pasta and the NATS door of a sandbox whose agent was killed (its first process ``pid``, alive
    and checked): its door listens again in the same folder (bound into that sandbox alone), and both are stopped
    once the sandbox ends, as for a sandbox this agent started."""
    held: list[Pasta | natsdoor.Door] = []
    if pid_file and _in_run_root(Path(pid_file)) and _is_pasta_of(Path(pid_file)) and \
            (pasta := Pasta.from_pid_file(pid_file)) is not None:
        held.append(pasta)
    if door and _in_run_root(Path(door)) and network is not None:
        with contextlib.suppress(OSError):
            held.append(natsdoor.Door.reopen(Path(door), network.nats_servers, network.connect))
    stop_after(pid, *held)


def release(pid_file: str, door: str) -> None:
    """Stop the pasta and remove the door of a sandbox that ended while no agent held them."""
    if pid_file and _in_run_root(Path(pid_file)):
        _stop_orphan(Path(pid_file))
    if door and _in_run_root(Path(door)):
        natsdoor.remove(Path(door))


def _in_run_root(path: Path) -> bool:
    return path.is_relative_to(RUN_ROOT) and ".." not in path.parts and not path.is_symlink()


def _is_pasta_of(pid_file: Path) -> bool:
    """Whether the process ``pid_file`` names is the pasta started with that file."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text().strip() or 0)
        return bool(pid) and str(pid_file).encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return False


def _stop_orphan(pid_file: Path) -> int:
    """Kill the pasta ``pid_file`` names if it is still the one started with that file; remove the file."""
    if (pasta := Pasta.from_pid_file(str(pid_file))) is not None:
        pasta.stop()  # through its pidfd: the number in a dead agent's file may be another process's by now
        return 1
    with contextlib.suppress(OSError):
        pid_file.unlink()
    return 0


def _attached(code: int, err: bytes, pid_file: str) -> Pasta:
    pasta = Pasta.from_pid_file(pid_file)
    if code or pasta is None:
        if pasta is not None:
            pasta.stop()
        raise NetworkUnavailable(f"pasta could not attach: {err.decode(errors='replace').strip()[-300:]}")
    return pasta


def _unroute_or_stop(network: Network, pasta: Pasta, pid: int, blocked: bool) -> None:
    """The node's own addresses out of reach (a blocked namespace has no route at all); pasta stopped if not."""
    if blocked and (network.nats_port or network.nats_servers):
        return
    try:
        unroute(network.node_addresses + NEVER_REACHED, pid)
    except (NetworkUnavailable, OSError, subprocess.TimeoutExpired) as exc:
        pasta.stop()
        raise NetworkUnavailable(str(exc)) from exc


def _stop(pid_file: str) -> None:
    """A pasta abandoned while it attached (it may have written its pid already)."""
    if (pasta := Pasta.from_pid_file(pid_file)) is not None:
        pasta.stop()


def probe(network: Network, argv: Callable[[int, int], list[str]], env: Mapping[str, str]) -> None:
    """Run a sandbox (``argv(info_fd, block_fd)``: bwrap running ``true``) with pasta attached, as replicas get it;
    raise NetworkUnavailable with pasta's or bwrap's words if it fails."""
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    try:
        proc = subprocess.Popen(argv(info_w, block_r), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, pass_fds=(info_w, block_r), env=env)
    except OSError as exc:
        raise NetworkUnavailable(f"bwrap could not run: {exc}") from exc
    finally:
        os.close(info_w)
        os.close(block_r)
    try:
        with os.fdopen(info_r, "rb") as info:
            pid = int(json.loads(info.read() or b"{}").get("child-pid", 0))
        pasta = attach_sync(network, pid, blocked=False)
    finally:
        os.close(block_w)
        _, err = proc.communicate(timeout=ATTACH_TIMEOUT_S)
    pasta.stop()
    if proc.returncode:
        raise NetworkUnavailable(f"bwrap with a network of its own failed: {err.decode().strip()[-300:]}")
