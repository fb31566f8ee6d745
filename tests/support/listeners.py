"""Plain TCP servers for the network tests: they accept each connection and close it, until closed themselves
(what a sandbox must or must not reach, standing for NATS or any other service of the node)."""

from __future__ import annotations

import contextlib
import socket
import threading


def accepting(host: str = "127.0.0.1", family: int = socket.AF_INET) -> socket.socket:
    """A server on ``host`` (a port of its own), accepting and closing connections in a thread of its own."""
    server = socket.create_server((host, 0), family=family)
    threading.Thread(target=_accept_all, args=(server,), daemon=True).start()
    return server


def _accept_all(server: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while True:
            server.accept()[0].close()
