"""A zygote's socket: bound by the node agent in its own state dir (which no sandbox sees) and handed to the zygote as
a listening descriptor; the agent connects to it to ask for a replica. Named by a digest of the zygote's key, and
reached through its folder's descriptor where the path is longer than a socket's address may be."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

ZygoteKey = tuple[str, str, int]  # app, service, version


def listen(path: Path) -> socket.socket:
    """The zygote's socket, bound by the agent in its own state dir and handed to the zygote as a descriptor."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        with _address(path) as address:
            listener.bind(address)
        os.chmod(path, 0o600)
        listener.listen(64)
        listener.set_inheritable(True)
    except BaseException:
        listener.close()
        raise
    return listener


def socket_name(key: ZygoteKey) -> str:
    """The file name of a zygote's socket: a digest of its key (app and class names can be long)."""
    return hashlib.sha256("\0".join(map(str, key)).encode()).hexdigest()[:16] + ".sock"


@contextlib.contextmanager
def _address(path: Path) -> Iterator[str]:
    """``path`` as a socket's address: itself where it fits (a socket's path is at most 107 bytes), else reached
    through a descriptor of its folder (a deep state directory)."""
    if len(os.fsencode(path)) < 100:
        yield str(path)
        return
    folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{folder}/{path.name}"
    finally:
        os.close(folder)


def connect(conn: socket.socket, path: Path) -> None:
    with _address(path) as address:
        conn.connect(address)

