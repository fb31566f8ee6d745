"""A process's pid on its node (``EMBER_HOST_PID``), which a sandboxed process cannot see for itself: in its
sandbox it has a pid namespace of its own, where ``os.getpid()`` is the sandbox's (2 for the first process of
every sandbox). What the node reports, kills and measures is the node's pid.

The agent hands the process one end of a Unix socket pair (its descriptor in ``EMBER_HOST_PID_FD``), on whose
other end the agent asked for its peer's credentials (``SO_PASSCRED``). The process sends one message; the
kernel attaches the sender's pid, translated into the agent's pid namespace; the agent answers with that number.
A replica forked by a zygote does the same on the connection that brought its fork request.

``python -m ember_runtime.hostpid MODULE ARGS...`` learns it, sets ``EMBER_HOST_PID``, then runs MODULE as
``python -m MODULE ARGS...`` would: the agent starts fresh replicas this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import runpy
import socket
import struct
import sys

ENV = "EMBER_HOST_PID"
FD_ENV = "EMBER_HOST_PID_FD"
ASK_TIMEOUT_S = 10.0
_CREDS = struct.Struct("iII")  # struct ucred: pid, uid, gid


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(the agent's end, non-blocking: ``answer`` waits on the loop, never in it; the end the process inherits)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    ours.setblocking(False)
    theirs.set_inheritable(True)
    return ours, theirs


def ask(sock: socket.socket, message: bytes = b"pid?") -> int:
    """Process side: send ``message``, get back this process's pid on the node."""
    sock.send(message)
    return int(sock.recv(64))


def learn() -> int:
    """This process's pid on its node, asked once of the agent when it handed over a socket; ``os.getpid()``
    otherwise (not sandboxed). Kept in ``EMBER_HOST_PID``, where the app's code finds it too."""
    fd = os.environ.pop(FD_ENV, "")
    pid = os.getpid()
    if fd.isdigit():
        with socket.socket(fileno=int(fd)) as sock, contextlib.suppress(OSError, ValueError):
            sock.settimeout(ASK_TIMEOUT_S)
            pid = ask(sock)
    os.environ[ENV] = str(pid)
    return pid


def current() -> int:
    """This process's pid on its node, as far as it knows (``os.getpid()`` outside a sandbox)."""
    known = os.environ.get(ENV, "")
    return int(known) if known.isdigit() else os.getpid()


async def receive(sock: socket.socket, size: int) -> tuple[bytes, int]:
    """Agent side: the next message on ``sock`` (non-blocking, ``SO_PASSCRED`` set) and the pid of the
    process that sent it, on this node (0 when the kernel did not say)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data, ancillary, _, _ = sock.recvmsg(size, socket.CMSG_SPACE(_CREDS.size))
            break
        except BlockingIOError:
            await readable(loop, sock)
    pid = 0
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(raw) >= _CREDS.size:
            pid = _CREDS.unpack(raw[:_CREDS.size])[0]
    return data, pid


async def answer(sock: socket.socket, size: int = 64) -> tuple[bytes, int]:
    """Agent side: receive the process's message and tell it its pid; returns both."""
    data, pid = await receive(sock, size)
    if data:
        await asyncio.get_running_loop().sock_sendall(sock, str(pid).encode())
    return data, pid


async def readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Wait until ``sock`` (non-blocking) has something to read, or its peer hung up; for calls that asyncio has no
    ``sock_`` method of, such as ``socket.recv_fds``."""
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


def main() -> None:
    module, *args = sys.argv[1:]
    learn()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
