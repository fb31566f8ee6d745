"""What a stopped zygote leaves on the node, and its end: its sandbox and its cgroup, once its forked replicas are gone.

A zygote's forked replicas live in its sandbox (its pid namespace, whose init is bwrap's first process), so the
sandbox outlives the zygote while they run. What else the zygote's code started there (a daemon in a session of its
own, left by a snap setup) would keep that first process alive for good, and with it the sandbox's network (pasta,
its NATS door) and the device nodes of GPUs since given to another app. So once the last replica forked from it has
exited, the agent SIGKILLs the sandbox's first process through a pidfd (every process of its pid namespace dies with
it), kills what is left in the zygote's cgroup (a node without sandboxes has no namespace to end), and removes the
cgroup. The agent's own stop ends them all at once: its replicas were stopped before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from ember_runtime.agent import descriptors, reap
from ember_runtime.agent.cgroups import MemoryCgroups
from ember_runtime.agent.sandbox import SandboxedProcess

EXIT_POLL_S = 0.1


class Remains:
    """A zygote's sandbox (its first process, held by a pidfd) and cgroup, and the replicas forked from it."""

    def __init__(self, first: int, cgroup: Path | None) -> None:
        """``first``: the sandbox's first process on this node, a number just given out (0: no sandbox)."""
        self.cgroup = cgroup
        self._first = _open(first) if first else -1
        self._forked: list[int] = []  # pidfds of the replicas forked from the zygote

    def forked(self, pid: int) -> None:
        """A replica forked from the zygote: its number just given out (the sandbox ends only after it)."""
        if (pidfd := _open(pid)) >= 0:
            self._forked.append(pidfd)

    async def end(self, wait: bool = True) -> None:
        """Once the forked replicas have exited (at once: ``wait`` false), end the sandbox and the cgroup. Cancelled
        while it waits, it holds them still, for an end without waiting."""
        if wait:
            for pidfd in self._forked:
                await _exited(pidfd)
        if self._first >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._first, signal.SIGKILL)  # the pid namespace's init: all of it ends
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_exited(self._first), reap.WAIT_S)
        await MemoryCgroups.end(self.cgroup, reap.WAIT_S)
        self.close()

    def close(self) -> None:
        for pidfd in [*self._forked, self._first]:
            if pidfd >= 0:
                descriptors.close(pidfd, "a pidfd of a stopped zygote's sandbox")
        self._forked, self._first = [], -1


class Teardowns:
    """The ends of stopped zygotes' remains under way (see ``Remains``), each waiting for its forked replicas."""

    def __init__(self) -> None:
        self._pending: dict[Remains, asyncio.Task[None]] = {}

    def begin(self, remains: Remains | None) -> None:
        if remains is not None and remains not in self._pending:
            task = asyncio.create_task(remains.end(), name="zygote-remains")
            self._pending[remains] = task
            task.add_done_callback(lambda _: self._pending.pop(remains, None))

    async def close(self) -> None:
        """End every sandbox still waiting for its forked replicas now (the agent stops: they were stopped)."""
        pending = dict(self._pending)
        for task in pending.values():
            task.cancel()
        await asyncio.gather(*pending.values(), return_exceptions=True)
        await asyncio.gather(*(remains.end(wait=False) for remains in pending), return_exceptions=True)


async def exit_code(proc: asyncio.subprocess.Process | SandboxedProcess) -> int:
    """The zygote process's exit code (bwrap's, sandboxed: the zygote's), once the loop saw it exit. Not
    ``proc.wait()``, which returns only once its output is closed too: the sandbox's first process holds that open
    while anything of the sandbox runs (a forked replica, a daemon), and it ends after the zygote, not before."""
    while (code := proc.returncode) is None:
        await asyncio.sleep(EXIT_POLL_S)
    return code


def _open(pid: int) -> int:
    try:
        return os.pidfd_open(pid)
    except OSError:
        return -1


async def _exited(pidfd: int) -> None:
    """Until ``pidfd``'s process has exited (a pidfd is readable from then on)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def exited() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, exited)
    try:
        await done
    finally:
        loop.remove_reader(pidfd)
