"""The door smith: the process that makes a node's NATS door sockets, inside the cgroup whose filter they carry
for life (``doorwall``). The agent starts it as a script (``python -I -S doorsmith.py GROUP FD``: no site, no
first-party import), it joins ``GROUP`` before it makes any socket, says ``READY`` on the channel ``FD``, then
answers each request (``family host port``, with a socket to answer on) from a thread of its own, ``AT_ONCE`` at
most: a TCP socket connected there, Nagle's algorithm off, passed back (``SCM_RIGHTS``), or ``no`` and the reason
(a thread it cannot start too: it goes on). It exits when the agent closes the channel (or dies)."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading

READY = b"ready"
CONNECT_TIMEOUT_S = 10.0
AT_ONCE = 64  # requests answered at once; more are refused (each door asks a few times a minute at most)


def main(argv: list[str]) -> int:
    group, channel = argv[1], socket.socket(fileno=int(argv[2]))
    try:
        with open(os.path.join(group, "cgroup.procs"), "w") as procs:
            procs.write("0")  # this process into the fenced group, before it makes any socket
    except OSError as exc:
        with contextlib.suppress(OSError):
            channel.send(f"no {exc}".encode()[:400])
        return 1
    channel.send(READY)
    slots = threading.BoundedSemaphore(AT_ONCE)
    while True:
        try:
            request, fds, _, _ = socket.recv_fds(channel, 512, 1)
        except OSError:
            return 0
        if not request and not fds:
            return 0  # the agent closed the channel, or is gone
        for extra in fds[1:]:
            os.close(extra)
        if fds:
            start(request, fds[0], slots)


def start(request: bytes, reply_fd: int, slots: threading.BoundedSemaphore) -> None:
    """Answer ``request`` from a thread of its own, or refuse it at once (too many at once, no thread to be had)."""
    if slots.acquire(blocking=False):
        try:
            threading.Thread(target=answer, args=(request, reply_fd, slots), daemon=True).start()
            return
        except RuntimeError as exc:  # can't start a new thread: the node's or the user's limit
            slots.release()
            why = str(exc)
    else:
        why = f"{AT_ONCE} connections are being made already"
    with socket.socket(fileno=reply_fd) as reply, contextlib.suppress(OSError):
        reply.send(f"no {why}".encode()[:400])


def answer(request: bytes, reply_fd: int, slots: threading.BoundedSemaphore) -> None:
    try:
        connect(request, reply_fd)
    finally:
        slots.release()


def connect(request: bytes, reply_fd: int) -> None:
    with socket.socket(fileno=reply_fd) as reply:
        try:
            family, host, port = request.decode().split(" ")
            tcp = socket.socket(int(family), socket.SOCK_STREAM)
        except (ValueError, OSError) as exc:
            with contextlib.suppress(OSError):
                reply.send(f"no {exc}".encode()[:400])
            return
        with tcp:
            try:
                tcp.settimeout(CONNECT_TIMEOUT_S)
                tcp.connect((host, int(port)))
                tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    reply.send(f"no {exc}".encode()[:400])
                return
            with contextlib.suppress(OSError):
                socket.send_fds(reply, [b"ok"], [tcp.fileno()])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
