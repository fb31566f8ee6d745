"""A replica forked by a zygote, as the node agent holds it (see ``zygote_pool``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket

import msgspec

from ember_runtime.agent import descriptors
from ember_runtime.zygote.protocol import MAX_MESSAGE, ExitReport

UNKNOWN_EXIT = 255  # the zygote went away before it could report its child's exit code


class ForkedProcess:
    """A replica forked by a zygote, with the part of ``asyncio.subprocess.Process`` that a slot uses.

    The zygote is the child's parent and reaps it; it reports the exit code over ``conn``. If the zygote
    dies first, a pidfd still tells when the child exits (its code is then unknown)."""

    def __init__(self, pid: int, conn: socket.socket, stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._conn = conn
        self._pidfd: int | None = None
        with contextlib.suppress(ProcessLookupError):
            self._pidfd = os.pidfd_open(pid)
        self._done = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> int:
        loop = asyncio.get_running_loop()
        code = UNKNOWN_EXIT
        with contextlib.suppress(OSError, msgspec.DecodeError):
            data = await loop.sock_recv(self._conn, MAX_MESSAGE)
            if data:
                code = msgspec.json.decode(data, type=ExitReport).code
        self._conn.close()
        if code == UNKNOWN_EXIT and self._pidfd is not None:  # the zygote died: wait for the child itself
            exited: asyncio.Future[None] = loop.create_future()

            def on_exit() -> None:
                if not exited.done():
                    exited.set_result(None)

            loop.add_reader(self._pidfd, on_exit)
            try:
                await exited
            finally:
                loop.remove_reader(self._pidfd)
        if self._pidfd is not None:
            descriptors.close(self._pidfd, f"the pidfd of forked replica {self.pid}")
            self._pidfd = None
        self.returncode = code
        return code

    async def wait(self) -> int:
        return await asyncio.shield(self._done)

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            return
        if self._pidfd is not None:
            signal.pidfd_send_signal(self._pidfd, sig)
        else:
            raise ProcessLookupError(self.pid)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
