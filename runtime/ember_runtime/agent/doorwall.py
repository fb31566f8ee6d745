"""A fence around the NATS sockets a sandbox's door hands out (``natsdoor``): they reach NATS' servers and nothing else.

A door's socket is made in the node's network, since NATS is there. Connected, it reaches one server; but code in
the sandbox can undo its connection (``connect`` with ``AF_UNSPEC``) and connect it again, to any port the node
reaches (its loopback services, the cloud's metadata service: a ``block_network=True`` function's way out), or bind
it to a port of the node. So the door's sockets are made by a process of their own, the door smith
(``doorsmith``), in a cgroup v2 group of its own, which carries cgroup BPF programs (``bpf``): a ``connect`` to
anything but NATS' servers fails (``EPERM``), a ``bind`` fails, and a packet whose socket's peer is not one of them
is dropped, coming or going. A socket is judged by the group it was made in, wherever its descriptor goes and for
as long as it lives, even after its group is removed.

The agent checks the fence once it is up (the smith's connection to a port of the agent's own must be refused)
and says, at start and in the node's status, when this node cannot have one (no cgroup v2 the agent may write, no
``CAP_BPF``/``CAP_NET_ADMIN``, another architecture): doors then hand out unfenced sockets, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ember_runtime import hostpid
from ember_runtime.agent import bpf, cgroups, doorsmith

log = logging.getLogger("ember.agent")
GROUP_PREFIX = "ember-doors-"  # <the agent's cgroup>/ember-doors-<agent pid>: the smith's group
READY_TIMEOUT_S = 10.0  # the smith's interpreter starts in tens of milliseconds
MAX_ADDRESSES = 256  # the NATS servers' addresses the fence holds, at most (it keeps those of sockets made before)
BOTH = (socket.AF_INET, socket.AF_INET6)
# (program type, attach point, the families whose servers' addresses it holds: none, it refuses everything)
HOOKS = ((bpf.CGROUP_SKB, bpf.INET_EGRESS, BOTH), (bpf.CGROUP_SKB, bpf.INET_INGRESS, BOTH),
         (bpf.CGROUP_SOCK_ADDR, bpf.INET4_CONNECT, (socket.AF_INET,)),
         (bpf.CGROUP_SOCK_ADDR, bpf.INET6_CONNECT, (socket.AF_INET6,)),
         (bpf.CGROUP_SOCK_ADDR, bpf.INET4_BIND, ()), (bpf.CGROUP_SOCK_ADDR, bpf.INET6_BIND, ()))


class WallUnavailable(RuntimeError):
    """This node cannot fence door sockets: the reason."""


def allowed_of(servers: Iterable[tuple[str, int]]) -> bpf.Allowed:
    """Every address each ``(host, port)`` resolves to, as the programs compare them."""
    found = set()
    for host, port in servers:
        with contextlib.suppress(OSError, UnicodeError):
            for family, _, _, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
                found.add(_entry(family, address))
    return frozenset(found)


def _entry(family: int, address: tuple[Any, ...]) -> tuple[int, bytes, int]:
    """One of ``getaddrinfo``'s answers, ``(host, port, ...)``, as the programs compare it."""
    return family, socket.inet_pton(family, str(address[0])), int(address[1])


def fence(group: Path, allowed: bpf.Allowed, *, servers_only: bool = False) -> None:
    """Attach the programs to ``group`` for ``allowed`` (``servers_only``: those that hold the addresses)."""
    for prog_type, attach_type, families in HOOKS:
        if families or not servers_only:
            layout = bpf.SKB if prog_type == bpf.CGROUP_SKB else bpf.SOCK_ADDR
            code = bpf.peer_filter(allowed, layout, families) if families else bpf.refuse_all()
            try:
                bpf.attach(group, code, prog_type, attach_type)
            except OSError as exc:
                raise WallUnavailable(f"cannot fence {group} (program {prog_type}, attach point {attach_type}): "
                                      f"{exc}") from exc


def sweep(parent: Path) -> int:
    """Remove the smiths' groups of agents no longer running (an agent killed outright leaves its group, empty)."""
    removed = 0
    with contextlib.suppress(OSError):
        for group in parent.glob(f"{GROUP_PREFIX}*"):
            pid = group.name.removeprefix(GROUP_PREFIX)
            if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):  # still holding a process: not empty, kept
                    group.rmdir()
                    removed += 1
    return removed


class DoorWall:
    """This agent's door smith and its fenced group: ``connect`` makes a socket that reaches NATS and nothing else."""

    def __init__(self, group: Path, servers: tuple[tuple[str, int], ...], allowed: bpf.Allowed,
                 smith: subprocess.Popen[bytes], channel: socket.socket) -> None:
        self.group = group
        self._servers = servers
        self._allowed = allowed
        self._smith = smith
        self._channel = channel
        self._restarting: asyncio.Future[tuple[subprocess.Popen[bytes], socket.socket]] | None = None
        self._closed = False

    @classmethod
    def start(cls, servers: Iterable[tuple[str, int]]) -> DoorWall:
        """A group of this agent's own, fenced for ``servers``, with the smith in it, ready and checked."""
        mount, own = cgroups.cgroup2_mount(), cgroups.own_cgroup()
        if mount is None or not own:
            raise WallUnavailable("this node has no cgroup v2 hierarchy")
        parent = mount / own.lstrip("/")
        if parent.name == cgroups.AGENT_LEAF:  # an agent started before moved itself to a leaf: its parent is ours
            parent = parent.parent
        sweep(parent)
        group = parent / f"{GROUP_PREFIX}{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
        except OSError as exc:
            raise WallUnavailable(f"cannot make a cgroup in {parent}: {exc}") from exc
        servers = tuple(servers)
        allowed = allowed_of(servers)
        try:
            fence(group, allowed)
            wall = cls(group, servers, allowed, *_start_smith(group))
        except WallUnavailable:
            with contextlib.suppress(OSError):
                group.rmdir()
            raise
        try:
            wall.check()
        except WallUnavailable:
            wall.close()
            raise
        return wall

    def check(self) -> None:
        """The fence holds: the smith's connection to a port of this agent's own (no NATS server) is refused."""
        try:
            with socket.create_server(("127.0.0.1", 0)) as bait:
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                with mine:
                    with theirs:
                        socket.send_fds(self._channel, [f"{socket.AF_INET} 127.0.0.1 {bait.getsockname()[1]}".encode()],
                                        [theirs.fileno()])
                    mine.settimeout(READY_TIMEOUT_S)
                    message, fds, _, _ = socket.recv_fds(mine, 512, 1)
                for fd in fds:
                    os.close(fd)
        except OSError as exc:  # no IPv4 loopback, the smith gone or silent
            raise WallUnavailable(f"the door sockets' fence could not be checked: {exc}") from exc
        if fds or f"[Errno {errno.EPERM}]".encode() not in message:
            raise WallUnavailable(f"the door sockets' filter does not hold here (a port not NATS': "
                                  f"{'connected' if fds else message.decode(errors='replace')})")

    async def connect(self, server: tuple[str, int]) -> socket.socket:
        """A TCP socket connected to NATS server ``server`` (a ``(host, port)`` of the node's NATS URL), made by the
        smith. Where ``server`` resolves to an address the fence does not hold (a name that resolves anew), the
        fence is made again with it added: it only grows (a socket the smith made to an address a later lookup no
        longer gives keeps working), up to ``MAX_ADDRESSES``, past which it is what the servers resolve to now."""
        if self._closed:
            raise OSError("the door smith was stopped")
        loop = asyncio.get_running_loop()
        entries = [(family, address) for family, _, _, _, address in
                   await loop.getaddrinfo(*server, type=socket.SOCK_STREAM)]
        if new := {_entry(family, address) for family, address in entries} - self._allowed:
            now = await asyncio.to_thread(allowed_of, self._servers)
            grown = self._allowed | now | new  # read after the wait: two rebuilds at once both keep the other's
            grown = grown if len(grown) <= MAX_ADDRESSES else now | new
            try:
                fence(self.group, grown, servers_only=True)
            except WallUnavailable as exc:
                raise OSError(str(exc)) from exc
            self._allowed = grown
        last: OSError = OSError(f"{server[0]} did not resolve")
        for family, address in entries:
            try:
                return await self._made(family, str(address[0]), int(address[1]))
            except OSError as exc:
                last = exc
        raise last

    async def _made(self, family: int, host: str, port: int) -> socket.socket:
        loop = asyncio.get_running_loop()
        while self._smith.poll() is not None:  # out of threads or memory, or signalled: the doors need it
            await self._restart()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with mine:
            with theirs:
                await _send_fds(self._channel, f"{family} {host} {port}".encode(), theirs.fileno())
            mine.setblocking(False)
            await hostpid.readable(loop, mine)
            message, fds, _, _ = socket.recv_fds(mine, 512, 1)
        if not fds:
            raise ConnectionRefusedError(message.decode(errors="replace").removeprefix("no ") or
                                         "the door smith did not answer")
        tcp = socket.socket(fileno=fds[0])
        tcp.setblocking(False)
        return tcp

    async def _restart(self) -> None:
        """Start the smith again (off the loop: it waits for the new one's word), once for every connect waiting."""
        if self._restarting is None:
            log.warning("the door smith exited (%s); starting it again", self._smith.returncode)
            self._restarting = asyncio.ensure_future(asyncio.to_thread(_start_smith, self.group))
        restarting = self._restarting
        try:
            smith, channel = await asyncio.shield(restarting)
        except WallUnavailable as exc:
            raise OSError(str(exc)) from exc
        finally:
            if self._restarting is restarting:
                self._restarting = None
        if self._channel is not channel:
            self._channel.close()
            self._smith, self._channel = smith, channel

    def close(self) -> None:
        """Stop the smith and remove its group (the sockets it made stay fenced: they hold the group's programs)."""
        self._closed = True
        self._channel.close()
        try:
            self._smith.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._smith.kill()
            self._smith.wait()
        with contextlib.suppress(OSError):
            self.group.rmdir()


async def _send_fds(channel: socket.socket, message: bytes, fd: int) -> None:
    """``socket.send_fds`` on a non-blocking ``channel``; while its buffer is full (hundreds of requests waiting on
    the smith), again a moment later. Polled, not a writer callback: the loop keeps one writer per descriptor, and
    several connects may wait at once."""
    pause = 0.001
    while True:
        try:
            socket.send_fds(channel, [message], [fd])
            return
        except BlockingIOError:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)


def _start_smith(group: Path) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """The smith, in ``group`` and ready; its channel (non-blocking). Its own session: a signal to the agent's
    process group (a terminal's Ctrl-C) leaves it to end when the agent closes the channel."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with theirs:
        try:
            smith = subprocess.Popen([sys.executable, "-I", "-S", doorsmith.__file__, str(group),
                                      str(theirs.fileno())], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            ours.close()
            raise WallUnavailable(f"cannot start the door smith: {exc}") from exc
    ours.settimeout(READY_TIMEOUT_S)
    try:
        said = ours.recv(512)
    except OSError:
        said = b""
    if said != doorsmith.READY:
        ours.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            smith.wait(timeout=READY_TIMEOUT_S)
        smith.kill()
        smith.wait()
        raise WallUnavailable(f"the door smith could not join {group}: "
                              f"{said.decode(errors='replace').removeprefix('no ').strip()[-300:] or 'no answer'}")
    ours.setblocking(False)
    return smith, ours
