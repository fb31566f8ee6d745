"""A sandbox's way to NATS: a door (a unix socket) through which the agent hands it sockets already connected.

A sandbox in a network namespace of its own reaches nothing of the node. Forwarding NATS' port through pasta's
splice stalled calls for about 40 ms now and then under load (delayed ACK against Nagle's algorithm on pasta's side,
which no option of Debian 12's pasta turns off; bench/RESULTS.md). Relaying every byte through the agent would cost
its event loop. So neither relays: the agent listens on a unix socket in a folder of that sandbox's own, bound into
the sandbox alone (``DOOR``); the replica's NATS client asks it for ``host port``, and the agent, in the node's
network, connects a TCP socket to that server (only a server of the node's NATS URL), turns Nagle's algorithm off
and passes the connected socket back (``SCM_RIGHTS``). From then on the replica talks to nats-server over a plain
loopback TCP connection, as a replica on the node's network does: no hop, no copy, no added latency. A reconnect
asks the door again. The socket is connected already, but a connection can be undone (``connect`` with
``AF_UNSPEC``) and made again elsewhere; so, where the node allows it, the agent's sockets are made in a cgroup whose
filter passes packets to NATS' servers only (``agent.doorwall``, given as ``connect``): the socket reaches NATS only.

``install()`` in the replica's process makes nats-py (which has no unix-socket URL) ask the door for each
connection when ``DOOR_ENV`` names one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ember_runtime import hostpid, pidwatch

log = logging.getLogger("ember.agent")
DOOR = "/run/ember-nats"  # where a sandbox sees its door's folder
DOOR_ENV = "EMBER_NATS_DOOR"  # the door's socket, inside the sandbox
SOCKET_NAME = "nats.sock"
ASK_TIMEOUT_S = 10.0
# Connections one door makes: a burst (a zygote's replicas starting together), then one a second. Each is a socket
# and a port of the node's (ephemeral ones are shared by every process of the node): a sandbox that asks on and
# on is refused, not let use them up. An ask that made no socket (NATS down, replicas trying again) costs nothing.
ASK_BURST, ASK_PER_S = 64, 1.0
NATS_DEFAULT_PORT = 4222
Connect = Callable[[tuple[str, int]], Awaitable[socket.socket]]  # a NATS server -> a socket connected to it


def servers_of(urls: str) -> frozenset[tuple[str, int]]:
    """``(host, port)`` of every server in a comma-separated NATS URL list: what a door connects to, nothing else."""
    found = set()
    for url in urls.split(","):
        url = url.strip()
        if not url:
            continue
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        with contextlib.suppress(ValueError):
            found.add((parts.hostname or "127.0.0.1", parts.port or NATS_DEFAULT_PORT))
    return frozenset(found)


class Door:
    """One sandbox's door: a listening unix socket in a folder (mode 0700) made for that sandbox alone."""

    def __init__(self, folder: Path, listener: socket.socket, servers: frozenset[tuple[str, int]],
                 connect: Connect) -> None:
        self.folder = folder
        self._listener = listener
        self._servers = servers
        self._connect = connect
        self._tasks: set[asyncio.Task[None]] = set()
        self._tokens, self._refilled = float(ASK_BURST), time.monotonic()

    @classmethod
    def open(cls, root: Path, servers: frozenset[tuple[str, int]], connect: Connect | None = None) -> Door:
        """A door in a new folder under ``root``, answered by the running loop (it only accepts and connects).
        ``connect`` makes its sockets (the node's fenced ones, ``agent.doorwall``); plain ones by default."""
        return cls._listen(Path(tempfile.mkdtemp(prefix="door-", dir=root)), servers, connect or plain)

    @classmethod
    def reopen(cls, folder: Path, servers: frozenset[tuple[str, int]], connect: Connect | None = None) -> Door:
        """The door of a sandbox whose agent was killed, listening again in its folder (the agent's own, 0700)."""
        info = folder.lstat()
        if not folder.is_dir() or folder.is_symlink() or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise OSError(f"{folder} is not a door's folder of this agent")
        with contextlib.suppress(FileNotFoundError):
            (folder / SOCKET_NAME).unlink()
        return cls._listen(folder, servers, connect or plain)

    @classmethod
    def _listen(cls, folder: Path, servers: frozenset[tuple[str, int]], connect: Connect) -> Door:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(folder / SOCKET_NAME))
            listener.listen(16)
            listener.setblocking(False)
        except OSError:
            listener.close()
            remove(folder)
            raise
        door = cls(folder, listener, servers, connect)
        asyncio.get_running_loop().add_reader(listener.fileno(), door._accept)
        return door

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            conn, _ = self._listener.accept()
            task = asyncio.ensure_future(self._answer(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(self, conn: socket.socket) -> None:
        """Read ``host port``; pass back a socket connected to that server if it is one of NATS', else a refusal."""
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        with conn:
            if not self._take_token():
                with contextlib.suppress(OSError):
                    await loop.sock_sendall(conn, f"no more than {ASK_BURST} connections at once and one a second "
                                                  "after".encode())
                return
            try:
                asked = await asyncio.wait_for(loop.sock_recv(conn, 512), ASK_TIMEOUT_S)
                host, _, port = asked.decode().strip().rpartition(" ")
                server = (host, int(port))
                if server not in self._servers:
                    raise ValueError(f"{host}:{port} is not a NATS server of this node")
                tcp = await asyncio.wait_for(self._connect(server), ASK_TIMEOUT_S)
            except (OSError, ValueError, UnicodeError, TimeoutError) as exc:
                self._tokens = min(float(ASK_BURST), self._tokens + 1)  # no socket made: none held (NATS down)
                with contextlib.suppress(OSError):
                    await loop.sock_sendall(conn, f"no {exc}".encode()[:400])
                return
            with tcp, contextlib.suppress(OSError):
                conn.setblocking(True)
                socket.send_fds(conn, [b"ok"], [tcp.fileno()])

    def _take_token(self) -> bool:
        now = time.monotonic()
        self._tokens = min(float(ASK_BURST), self._tokens + (now - self._refilled) * ASK_PER_S)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    @property
    def env(self) -> dict[str, str]:
        """What tells the sandbox's replica runtime where its door is."""
        return {DOOR_ENV: f"{DOOR}/{SOCKET_NAME}"}

    def stop(self) -> None:
        if self._listener.fileno() < 0:
            return
        with contextlib.suppress(ValueError, RuntimeError):
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
        self._listener.close()
        for task in list(self._tasks):
            task.cancel()
        remove(self.folder)

    def stop_after(self, pid: int) -> None:
        """Close once process ``pid`` (the sandbox's first process) exits, seen by the running loop."""
        pidwatch.when_exits(pid, self.stop)


async def plain(server: tuple[str, int]) -> socket.socket:
    """A socket of this process connected to ``server``: one the sandbox could point elsewhere (see ``Door``)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(*server, type=socket.SOCK_STREAM)
    last: OSError = OSError(f"{server[0]} did not resolve")
    for family, kind, proto, _, address in infos:
        tcp = socket.socket(family, kind, proto)
        tcp.setblocking(False)
        try:
            await loop.sock_connect(tcp, address)
        except OSError as exc:
            tcp.close()
            last = exc
            continue
        tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return tcp
    raise last


def remove(folder: Path) -> None:
    with contextlib.suppress(OSError):
        (folder / SOCKET_NAME).unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()


async def ask(path: str, host: str, port: int) -> socket.socket:
    """The replica's side: a TCP socket connected to NATS server ``host:port``, from the door at ``path``. On the
    event loop, not a thread: a replica forked from a zygote would start the loop's thread pool for it, which
    lengthened its start by 1-5 ms."""
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as door:
        door.setblocking(False)
        await loop.sock_connect(door, path)
        await loop.sock_sendall(door, f"{host} {port}\n".encode())
        await hostpid.readable(loop, door)
        message, fds, _, _ = socket.recv_fds(door, 512, 1)
    if not fds:
        raise ConnectionRefusedError(f"the NATS door refused: {message.decode(errors='replace')}")
    tcp = socket.socket(fileno=fds[0])
    tcp.setblocking(False)
    return tcp


def install(env: dict[str, str] | None = None) -> bool:
    """Make nats-py connect through the door ``DOOR_ENV`` names, if it names one (in a sandbox of its own)."""
    path = (os.environ if env is None else env).get(DOOR_ENV, "")
    if not path:
        return False
    import nats.aio.client
    from nats.aio.transport import TcpTransport

    class DoorTransport(TcpTransport):  # type: ignore[misc]
        """nats-py's TCP transport (TLS upgrade included), its connection taken from the door."""

        async def connect(self, uri: Any, buffer_size: int, connect_timeout: int) -> None:
            tcp = await asyncio.wait_for(ask(path, uri.hostname, uri.port or NATS_DEFAULT_PORT), connect_timeout)
            reader, writer = await asyncio.open_connection(sock=tcp, limit=buffer_size)
            self._bare_io_reader = self._io_reader = reader
            self._bare_io_writer = self._io_writer = writer

    nats.aio.client.TcpTransport = DoorTransport  # type: ignore[misc]
    return True
