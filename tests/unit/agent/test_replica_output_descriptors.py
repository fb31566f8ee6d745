"""The agent reads each replica's output on its event loop (uvloop), and each descriptor it reads has one owner,
which closes it once.

Before, the agent read a replica's FIFOs (and a forked replica's pipes) through uvloop's ``connect_read_pipe``,
whose transport stays open after the end of file and is closed when the garbage collector frees it, twice: libuv
closes the descriptor, then the file object it was handed closes the same number again (MagicStack/uvloop#763).
Between the two, one of the agent's threads (the GPU memory watch reading /proc, a bundle's digest, pasta's
set-up) could open a file and be given that number: the second close closed the thread's file, and the thread's
own close later closed whatever the loop had opened under that number meanwhile. Seen on the session platform
as a zygote that "could not start: OSError: [Errno 9] Bad file descriptor" (a descriptor it was to inherit,
closed), then a replica whose every restart "could not start: FileExistsError: [Errno 17] File exists" (a pipe
the loop was reading, closed under it: its registration stayed, and refused each new pipe given its number)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path

import pytest

from ember import _loop as ember_loop
from ember_runtime.agent import adoption, descriptors, slots
from ember_runtime.agent.slots import ReplicaSlot, SlotKey

RESTARTS = 60
OUTPUT = 4 << 20  # bytes a replica writes: many times what a reader buffers before it pauses
GUARD_S = 120.0  # not a speed bound: the restarts either go on or stop (58 took 30 s under a full suite on 2 cores)


class _Opener(threading.Thread):
    """An agent thread's share of the descriptor table: it opens pipes and checks, before it closes each, that the
    number is still its own. Those closed under it are kept in ``stolen`` (and not closed again)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stolen: list[int] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            ends = os.pipe()
            first = [os.fstat(fd).st_ino for fd in ends]
            for fd, inode in zip(ends, first, strict=True):
                try:
                    if os.fstat(fd).st_ino != inode:
                        raise OSError(f"fd {fd} is another file now")
                    os.close(fd)  # (closed under it between the check and here: EBADF)
                except OSError:
                    self.stolen.append(fd)


def _interpreter(tmp_path: Path) -> Path:
    """The replica's interpreter: it says a line on each stream and exits at once (the slot restarts it)."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho out\necho err >&2\n")
    python.chmod(0o755)
    return python


async def _restart_often(tmp_path: Path) -> tuple[int, list[int]]:
    opener = _Opener()
    opener.start()
    # No NATS here: what a slot publishes (its output, its crashes) is dropped when it cannot be sent.
    slot = ReplicaSlot(SlotKey("a", "f", 1, 0, "r-output"), nc=None, replicas_kv=None, nats_url="nats://127.0.0.1:1",
                       node_id="n", bundle=tmp_path, module="m", env={}, first_start=("fresh", time.time(), 0.0),
                       python=_interpreter(tmp_path), records=adoption.Records(tmp_path / "replicas"))
    slot.start()
    try:
        deadline = time.monotonic() + GUARD_S
        while slot.restarts < RESTARTS and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        await slot.stop(grace_s=1.0)
        opener.done.set()
        await asyncio.to_thread(opener.join)
    return slot.restarts, opener.stolen


def test_a_replica_restarted_again_and_again_closes_only_its_own_descriptors(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(slots, "BACKOFF_START_S", 0.0)  # each exit restarted at once
    caplog.set_level(logging.WARNING, "ember.agent")
    with asyncio.Runner(loop_factory=ember_loop.loop_factory()) as runner:  # the agent's loop (``ember._loop``)
        restarts, stolen = runner.run(_restart_often(tmp_path))
        failed = [r.getMessage() for r in caplog.records if "could not start" in r.getMessage()]
        assert stolen == [], f"descriptors of another thread closed under it: {stolen}; starts that failed: {failed}"
        assert failed == []
        assert restarts >= RESTARTS


def _write_all(fd: int, data: bytes) -> None:
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(data)


async def _read_slowly_then_all(reader: asyncio.StreamReader, writing: asyncio.Future[None]) -> bytes:
    first = await reader.read(1)
    await asyncio.sleep(0.5)  # no read meanwhile: the reader's buffer is full, the pipe too, the writer waits
    assert not writing.done(), "the agent read on while nobody took what it had read"
    return first + await reader.read()


def test_a_pipe_read_by_the_agent_is_paused_while_its_reader_is_full_and_closed_once_at_its_end(caplog):
    caplog.set_level(logging.WARNING, "ember.agent")
    data = os.urandom(OUTPUT)

    async def go() -> tuple[bytes, int]:
        r, w = os.pipe()
        reader = descriptors.read_pipe(r, "a test's pipe")
        writing = asyncio.ensure_future(asyncio.to_thread(_write_all, w, data))
        got = await _read_slowly_then_all(reader, writing)
        await writing
        return got, r

    with asyncio.Runner(loop_factory=ember_loop.loop_factory()) as runner:
        got, fd = runner.run(go())
    assert got == data
    with pytest.raises(OSError):  # closed by its reader at the end
        os.fstat(fd)
    assert caplog.records == []
    descriptors.close(fd, "a test's pipe")  # a second close is said, with what it was for
    assert [r.getMessage() for r in caplog.records] == [
        f"a test's pipe (fd {fd}) was closed already: a double close, whose first may have closed another descriptor "
        "of the agent"]

