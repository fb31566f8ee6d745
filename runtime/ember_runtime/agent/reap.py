"""Ending what a start left behind: a sandbox whose start was abandoned, a forked replica nobody will hear of."""

from __future__ import annotations

import asyncio
import contextlib
import json
import platform
import signal
from pathlib import Path
from typing import Any

from ember_runtime.agent.leaders import Leader

WAIT_S = 5.0  # what a sandbox whose start was abandoned is given to say its pid, and to exit
_READ = {"x86_64": 0, "aarch64": 63, "riscv64": 63}.get(platform.machine())  # read(2)'s number, in /proc/PID/syscall


class Unstarted(RuntimeError):
    """A sandbox's first process ended, or took too long, before it waited to be let go on."""


def kill_group(pid: int) -> None:
    """SIGKILL ``pid`` and the process group it leads (a sandbox's first process, a forked replica: each leads
    its own session, where every process it started is). ``pid`` must be its number still: one just given out."""
    leader = Leader.open(pid)
    leader.kill()
    leader.close()


def children(pid: int) -> list[int]:
    """The processes ``pid`` (one thread) started and that run still; [] where the kernel does not list them."""
    with contextlib.suppress(OSError, ValueError):
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


async def _stopped(pid: int, within_s: float = 1.0) -> None:
    """Until ``pid`` is stopped (or gone), ``within_s`` at most."""
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            return
        if state in ("T", "t", "Z", "X"):
            return
        await asyncio.sleep(0.001)


def child_pid(info: bytes) -> int:
    """The sandbox's first process on this node, from what bwrap wrote to its ``--info-fd`` (0 if it did not)."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        found: Any = json.loads(info).get("child-pid", 0)
        return int(found)
    return 0


async def spawned(spawning: asyncio.Future[asyncio.subprocess.Process]) -> asyncio.subprocess.Process | None:
    """The process ``spawning`` (``create_subprocess_exec``, shielded from a cancel) started, once it has; None
    where it failed."""
    try:
        return await spawning
    except Exception:
        return None


async def discard(proc: asyncio.subprocess.Process, reading: asyncio.Future[bytes]) -> bytes:
    """Kill a sandbox whose start was abandoned: bwrap, stopped first so that it starts nothing more, then each
    process it had started, with its group (a zygote's outlives bwrap, and it may run before bwrap said which it
    is: ``reading``, its ``--info-fd``). Its output is read to the end, so that its transport closes; what it
    wrote to stderr is returned (bwrap's own words, where it failed by itself)."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGSTOP)
    await _stopped(proc.pid)  # a signal takes effect as the process next runs: a clone under way completes first
    started = [Leader.open(child) for child in children(proc.pid)]  # held while bwrap, stopped, reaps none of them
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    for held in started:
        held.kill()
        held.close()
    info = b""
    with contextlib.suppress(Exception, asyncio.CancelledError):  # bwrap wrote it, or closed the pipe dying
        info = await asyncio.wait_for(asyncio.shield(reading), WAIT_S)
    if child := child_pid(info):
        kill_group(child)  # bwrap gave out its number during this start, seconds ago at most
    said = b""
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await asyncio.wait_for(proc.wait(), WAIT_S)
    for out in (proc.stdout, proc.stderr):
        with contextlib.suppress(Exception, asyncio.CancelledError):
            if out is not None:
                said = await asyncio.wait_for(out.read(), WAIT_S)  # stderr last
    return said


async def until_waiting(pid: int, fd: int, timeout_s: float) -> None:
    """Until bwrap's first process ``pid`` has set its sandbox up and waits on ``fd`` (``--block-fd``), read from
    /proc: the system call it is blocked in (read on ``fd``), or where the kernel shows no number for it, what it
    waits in (a pipe read). Unstarted if it ends first, or takes longer."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if not running(pid):
            raise Unstarted("the sandbox ended as it was set up")
        with contextlib.suppress(OSError, ValueError, IndexError):
            call = Path(f"/proc/{pid}/syscall").read_text().split()
            if _READ is not None and call[0] == str(_READ) and int(call[1], 16) == fd:
                return
            if _READ is None and "pipe" in Path(f"/proc/{pid}/wchan").read_text():
                return
        await asyncio.sleep(0.001)
    raise Unstarted(f"the sandbox was not set up within {timeout_s:.0f}s")


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return pid > 0 and state not in ("Z", "X")
