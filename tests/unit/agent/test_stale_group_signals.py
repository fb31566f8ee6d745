"""The agent signals a replica's process group through a pidfd of its leader, never by its number (issue 27).

A pid number is free again once its process is reaped and nothing is left in the group or session it led (asyncio
reaps a replica at once; bwrap reaps its sandbox's init). Before, the slot SIGKILLed the group of a replica that had
exited by number (``os.killpg``: "what a crashed replica started dies with it", and a stop's "whatever is left"), as
did a sandbox's ``send_signal``: whatever group a new process led under that number meanwhile was killed instead:
another tenant's sandbox (bwrap's init leads a session), another replica, a node agent started in a session of its
own. Seen twice in the suite, where pid numbers wrap around within minutes: a node agent, and a sandbox running
``sleep 60``, gone without a trace.

Here a bystander is made to take the number at once (``/proc/sys/kernel/ns_last_pid``, writable by root alone: the
tests skip elsewhere), leading a session of its own, and must outlive the agent's signals. What outlived its leader in
the group is still reached (the pidfd names the leader's group, not its number)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest
from support.polling import wait_for

from ember_runtime.agent import leaders, sandbox
from ember_runtime.agent.leaders import Leader
from ember_runtime.agent.sandbox import Jail, environment
from ember_runtime.agent.slots import ReplicaSlot, SlotKey

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
T = TypeVar("T")
TRIES = 200  # other processes of the node may take the number first: tried again
SCENARIOS = 5  # and one may keep it (a busy suite starts processes all the time): the scenario runs again


class NumberTaken(Exception):
    """Another process of the node took the number before the bystander could: the scenario must run again."""


def retried(scenario: Callable[[], T]) -> T:
    """``scenario()``, run again (up to ``SCENARIOS`` times) while another process takes the number it frees."""
    for _ in range(SCENARIOS - 1):
        try:
            return scenario()
        except NumberTaken:
            continue
    return scenario()


def take_number(pid: int) -> subprocess.Popen[bytes]:
    """A bystander (``sleep``, leading a session of its own) that is process ``pid``, now free; a skip where this
    process cannot choose the next pid."""
    for _ in range(TRIES):
        if Path(f"/proc/{pid}").exists():
            raise NumberTaken(f"pid {pid} was taken by another process of this node")
        try:
            NS_LAST_PID.write_text(str(pid - 1))
        except OSError as exc:
            pytest.skip(f"the next pid cannot be chosen here (root only): {exc}")
        bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if bystander.pid == pid:
            return bystander
        bystander.kill()
        bystander.wait()
    # Free of processes but not given: a group or session id still (a leftover of its group not reaped yet).
    raise NumberTaken(f"pid {pid} was never given to the bystander in {TRIES} tries")


def gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether process ``pid`` is reaped (its number free) within ``within_s``; the loop is not run meanwhile."""
    deadline = time.monotonic() + within_s
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_a_replica_slot_never_kills_a_group_that_took_its_replicas_number(tmp_path: Path) -> None:
    """The replica exits and is reaped; before the slot hears of it, a bystander leads a group under its number. The
    slot's SIGKILL to what the replica left (and its restart) must not reach the bystander."""
    pid_file = tmp_path / "pid"
    python = tmp_path / "python"  # the replica's interpreter: it says its pid, and waits
    # Builtins alone before the exec: a child of the script (an `mv` that wrote the file and had not exited yet)
    # would outlive the kill in the replica's group, orphaned, and hold its number as that group's id until reaped:
    # by pid 1, which in a container may never reap ("never given to the bystander in 200 tries" in CI).
    python.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    python.chmod(0o755)

    def started(other_than: int = 0) -> int:
        text = pid_file.read_text() if pid_file.exists() else ""  # one write: whole once it ends its line
        return int(text) if text.endswith("\n") and int(text) != other_than else 0

    async def go() -> subprocess.Popen[bytes]:
        # No NATS here: what a slot publishes (its crashes) is dropped when it cannot be sent.
        slot = ReplicaSlot(SlotKey("a", "f", 1, 0, "r-stale"), nc=None, replicas_kv=None,
                           nats_url="nats://127.0.0.1:1", node_id="n", bundle=tmp_path, module="m", env={},
                           first_start=("fresh", time.time(), 0.0), python=python)
        slot.start()
        bystander = None
        try:
            while not (first := started()) or getattr(slot._proc, "pid", 0) != first:
                await asyncio.sleep(0.01)  # and the slot holds it (the pidfd it opens at the start: no turn of the
                # pids comes between a start and that, unless one is forced as here)
            # From here until the bystander runs, the loop runs nothing: asyncio's watcher thread reaps the replica,
            # and the slot hears of its exit only after.
            os.kill(first, signal.SIGKILL)  # alive and not reaped: its number is its own
            if not gone(first):
                pytest.skip("this event loop reaps its children on its own thread: no process can take the number "
                            "before the slot hears of the exit")
            bystander = take_number(first)
            while not started(other_than=first):  # restarted: the slot's clean-up after the exit has run
                await asyncio.sleep(0.01)
            return bystander
        except BaseException:
            if bystander is not None:
                bystander.kill()
                bystander.wait()
            raise
        finally:
            await slot.stop(grace_s=1.0)

    bystander = retried(lambda: asyncio.run(asyncio.wait_for(go(), 30)))
    try:
        assert bystander.poll() is None, f"the bystander that took the replica's number ended: {bystander.returncode}"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_sandbox_that_ended_is_not_signalled_by_its_inits_number(node_sandbox, tmp_path: Path) -> None:
    """bwrap reaps its sandbox's init (the group the agent signals): a signal after the sandbox ended must not reach
    a group that took the init's number."""

    async def go() -> sandbox.SandboxedProcess:
        proc = await sandbox.start(node_sandbox, ["true"], Jail(bundle=tmp_path), environment({}, sandboxed=True),
                                   partial(sandbox.prepare_child, None))
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        return proc

    def ended_and_taken() -> tuple[sandbox.SandboxedProcess, subprocess.Popen[bytes]]:
        proc = asyncio.run(go())
        assert gone(proc.pid), "the sandbox's init was not reaped"
        return proc, take_number(proc.pid)

    proc, bystander = retried(ended_and_taken)
    try:
        proc.send_signal(signal.SIGKILL)
        assert not _ended(bystander), "the bystander that took the init's number was killed"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_leader_held_by_its_pidfd_is_signalled_never_its_number_after(tmp_path: Path) -> None:
    """The guard itself: once the leader is reaped and its number another's, nothing is sent to that number."""
    def reaped_and_taken() -> tuple[Leader, subprocess.Popen[bytes]]:
        leader = subprocess.Popen(["sleep", "60"], start_new_session=True)
        held = Leader.open(leader.pid)
        leader.kill()
        leader.wait()
        try:
            return held, take_number(leader.pid)
        except NumberTaken:
            held.close()
            raise

    held, bystander = retried(reaped_and_taken)
    try:
        held.signal_group(signal.SIGKILL)
        held.signal(signal.SIGKILL)
        held.kill()
        assert not _ended(bystander), "the bystander that took the leader's number was killed"
    finally:
        held.close()
        bystander.kill()
        bystander.wait()


def test_what_outlived_its_leader_in_its_group_is_still_reached() -> None:
    """The group kill after the leader exited still ends what it left behind in its group (the reason for it)."""
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!"], stdout=subprocess.PIPE, start_new_session=True)
    held = Leader.open(leader.pid)
    try:
        assert leader.stdout is not None
        member = int(leader.stdout.readline())
        leader.wait()
        leader.stdout.close()
        assert _state(member) not in ("", "Z"), "the member should run still"
        held.kill()
        wait_for(lambda: _state(member) in ("", "Z"), timeout_s=5, every_s=0.01, what="the leftover member to die")
    finally:
        held.close()


def test_before_linux_6_9_a_group_is_signalled_by_number_only_while_its_leader_runs() -> None:
    """Where the kernel cannot signal a group through a pidfd: by number while the leader has not exited (its number
    is its own), never after."""
    running = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; exec sleep 60"], stdout=subprocess.PIPE,
                               start_new_session=True)
    ended = subprocess.Popen(["sleep", "60"], start_new_session=True)
    pidfds = [os.pidfd_open(running.pid), os.pidfd_open(ended.pid)]
    try:
        assert running.stdout is not None
        member = int(running.stdout.readline())
        running.stdout.close()
        leaders.signal_group_by_number(pidfds[0], running.pid, signal.SIGKILL)
        assert running.wait(5) == -signal.SIGKILL
        wait_for(lambda: _state(member) in ("", "Z"), timeout_s=5, every_s=0.01, what="the member to die")

        ended.kill()
        ended.wait()
        bystander = take_number(ended.pid)
        try:
            leaders.signal_group_by_number(pidfds[1], ended.pid, signal.SIGKILL)
            assert not _ended(bystander), "the bystander that took the leader's number was killed"
        finally:
            bystander.kill()
            bystander.wait()
    finally:
        for pidfd in pidfds:
            os.close(pidfd)


def _state(pid: int) -> str:
    """Process ``pid``'s state letter ("" when gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def _ended(proc: subprocess.Popen[bytes], within_s: float = 0.2) -> bool:
    """Whether ``proc`` ends within ``within_s`` (a SIGKILL sent to it takes effect at once)."""
    try:
        proc.wait(within_s)
    except subprocess.TimeoutExpired:
        return False
    return True

