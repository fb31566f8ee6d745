"""Replicas that outlive their node agent's death, and the restarted agent that adopts them.

The process model, and what this changes:

- The agent starts a fresh replica as bwrap (outer) -> bwrap's init (the sandbox's pid 1 on the node, leading a
  session of its own) -> ``python -m ember_runtime.replica``; without a sandbox, the replica itself in a session of
  its own. pasta (its network) and the NATS door (``natsdoor``) are the agent's, stopped when the sandbox's init
  exits (``pidwatch``). A zygote and the replicas it forks hold the agent's lifeline pipe.
- Before, the agent's death took every replica with it (the parent-death signal, bwrap's ``--die-with-parent``) and
  its stdout and stderr were pipes only the agent read. Now a fresh replica has neither: it is not the agent's in
  the kill sense. Its stdout and stderr are FIFOs in the agent's state dir, of which the replica also holds a read
  end (a write never fails while no agent reads: it waits in a 1 MiB pipe); its lifeline is a FIFO too, whose
  write end the agent holds: the replica sees it hang up when the agent dies, keeps serving over its own NATS
  connection, and drains and stops if no agent has opened it again within ``NODE_LOST_S``, when the control plane
  counts the node lost and starts its replicas elsewhere (``ember_runtime.lifeline``).
- Per running replica, a record (``Record``) in ``<state dir>/replicas/<replica id>/`` (folders 0700, the agent's
  alone), beside its FIFOs: pid and start time (from ``/proc/<pid>/stat``: a reused pid is not it), a random
  nonce in its environment, its replica id, app, version, index, bundle, cgroup, restarts, pasta and door. Written
  once it started, removed when it exits or is stopped.
- A restarted agent reads the records before anything else (its sweep of dead agents' pastas leaves theirs), and
  keeps those whose process is still the one it started (same uid and start time, the nonce in
  ``/proc/<pid>/environ``, the replica id on its command line); every other record is removed, said in the log, and
  its replica starts afresh as after a crash. The slot of a replica the node's assignment still holds adopts the
  process instead of starting one (its FIFOs opened again, its exit watched through a pidfd, its door listening
  again in the same folder, its pasta stopped when it ends), and reports it under the same id: no new replica. A
  record the assignment no longer holds is stopped, as a removed replica is.
- A clean stop (SIGTERM) stops and drains every replica as before, and removes the records.
- Zygotes, and replicas forked from them, keep their lifeline: they stop with the agent, and the restarted agent
  builds the zygote again (they serve no call until a scale-up forks them).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import logging
import os
import re
import secrets
import signal
from pathlib import Path
from typing import Any

import msgspec

from ember_runtime.agent import descriptors, leaders, netns
from ember_runtime.agent.bundles import remove_tree
from ember_runtime.lifeline import LIFELINE_ENV

log = logging.getLogger("ember.agent")
MARK_ENV = "EMBER_REPLICA_MARK"  # a nonce in the replica's environment: the agent's mark on what it started
RECORD = "record.json"
OUT, ERR, LIFELINE = "stdout", "stderr", "lifeline"
PIPE_BYTES = 1 << 20  # what a replica may write while no agent reads before a write waits
UNKNOWN_EXIT = 255  # an adopted replica is not the agent's child: its exit code is not known
_ID = re.compile(r"^[A-Za-z0-9_-]{1,200}$")  # a replica id: one NATS subject token


class Record(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    app: str
    service: str
    version: int
    index: int
    bundle_sha256: str
    pid: int  # the process group: bwrap's init in a sandbox, else the replica
    start_time: int  # /proc/<pid>/stat's starttime (clock ticks since boot)
    nonce: str
    restarts: int = 0
    cgroup: str = ""
    pasta_pid_file: str = ""
    door: str = ""
    command_id: str = ""  # the id on its command line, where it began as a warm start (``warm_starts``)


_decoder = msgspec.json.Decoder(Record)


def start_time(pid: int) -> int | None:
    """Process ``pid``'s start time (clock ticks since boot); None if it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (OSError, ValueError):
        return None
    return int(fields[19]) if len(fields) > 19 and fields[0] not in ("Z", "X") else None


def not_ours(record: Record) -> str:
    """Why the process a record names is not the replica this agent started ("" when it is)."""
    if record.pid <= 1:
        return f"pid {record.pid} is not a replica's"
    try:
        if os.stat(f"/proc/{record.pid}").st_uid != os.getuid():
            return f"process {record.pid} is another user's"
        environ = Path(f"/proc/{record.pid}/environ").read_bytes().split(b"\0")
        argv = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"process {record.pid} is gone"
    if start_time(record.pid) != record.start_time:
        return f"process {record.pid} is gone (its number is another process's now)"
    if f"{MARK_ENV}={record.nonce}".encode() not in environ:
        return f"process {record.pid} does not carry the agent's mark"
    if (b"--replica-id", (record.command_id or record.replica_id).encode()) not in itertools.pairwise(argv):
        return f"process {record.pid} is not replica {record.replica_id}"
    return ""


class Pipes:
    """A fresh start's FIFOs: the replica's stdout and stderr (write ends its own, read ends held by both) and its
    lifeline (the agent holds the write end)."""

    def __init__(self, folder: Path) -> None:
        for name in (OUT, ERR, LIFELINE):
            with contextlib.suppress(FileNotFoundError):
                (folder / name).unlink()
            os.mkfifo(folder / name, 0o600)
        self.nonce = secrets.token_hex(16)
        self.reads: list[int] = []
        self.writes: list[int] = []
        self._life_read = self.lifeline = -1
        try:
            self.reads = [os.open(folder / n, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC) for n in (OUT, ERR)]
            self.writes = [os.open(folder / n, os.O_WRONLY | os.O_CLOEXEC) for n in (OUT, ERR)]
            for fd in self.writes:
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            self._life_read = os.open(folder / LIFELINE, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self.lifeline = os.open(folder / LIFELINE, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self.close()
            raise

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (*self.reads, self._life_read)

    @property
    def env(self) -> dict[str, str]:
        return {LIFELINE_ENV: str(self._life_read), MARK_ENV: self.nonce}

    def started(self) -> tuple[asyncio.StreamReader, asyncio.StreamReader]:
        """The replica runs: the agent lets go of what is the replica's, and its output's readers own the read ends
        (one step, which no cancel splits). Where a reader cannot be made, ``close`` still lets go of the rest."""
        for fd, end in zip(self.writes, (OUT, ERR), strict=True):
            descriptors.close(fd, f"the write end of a replica's {end} FIFO")
        descriptors.close(self._life_read, "the read end of a replica's lifeline FIFO")
        reads, self.reads, self.writes, self._life_read = self.reads, [], [], -1
        out, err = descriptors.read_pipes((reads[0], f"a replica's {OUT} FIFO"), (reads[1], f"a replica's {ERR} FIFO"))
        return out, err

    def close(self) -> None:
        """The start failed: what no reader took is let go of."""
        for fd in (*self.reads, *self.writes):
            descriptors.close(fd, "a replica's output FIFO")
        descriptors.close(self._life_read, "the read end of a replica's lifeline FIFO")
        descriptors.close(self.lifeline, "the write end of a replica's lifeline FIFO")
        self.reads, self.writes, self._life_read, self.lifeline = [], [], -1, -1


class Adopted:
    """A replica a previous agent started, with the part of ``asyncio.subprocess.Process`` that a slot uses. Its
    exit is seen through a pidfd; its code is not known (``UNKNOWN_EXIT``)."""

    def __init__(self, record: Record, pidfd: int, lifeline: int, stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader, leader: leaders.Leader) -> None:
        self.record = record
        self.pid = record.pid
        self.leader = leader  # its group, signalled through a pidfd of its own (this one is closed at the exit)
        self.host_pid = 0
        self.lifeline = lifeline
        self.stdout, self.stderr = stdout, stderr
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._exited = asyncio.Event()
        asyncio.get_running_loop().add_reader(pidfd, self._on_exit)

    def _on_exit(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        descriptors.close(self._pidfd, f"the pidfd of adopted replica {self.record.replica_id}")
        self.returncode = UNKNOWN_EXIT
        self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        return UNKNOWN_EXIT

    def send_signal(self, sig: int) -> None:
        self.leader.signal_group(sig)

    @classmethod
    async def take(cls, folder: Path, record: Record) -> Adopted | None:
        """The replica of ``record`` adopted: its exit watched, its FIFOs opened again; None if it is gone or not
        the one this record was written for."""
        try:
            pidfd = os.pidfd_open(record.pid)
        except OSError:
            return None
        fds: list[int] = []
        handed = 0  # how many of ``fds`` are the readers' (who close them)
        try:
            if why := not_ours(record):  # checked once the pidfd is open: the pidfd is the process checked
                raise OSError(why)
            fds = [os.open(folder / n, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC) for n in (OUT, ERR)]
            fds.append(os.open(folder / LIFELINE, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))  # ENXIO: none reads
            leader = leaders.Leader(record.pid, os.dup(pidfd))
            handed = 2
            out, err = descriptors.read_pipes((fds[0], f"adopted replica {record.replica_id}'s {OUT} FIFO"),
                                              (fds[1], f"adopted replica {record.replica_id}'s {ERR} FIFO"))
        except OSError as exc:
            log.warning("replica %s is not adopted: %s", record.replica_id, exc)
            for fd in (pidfd, *fds[handed:]):
                descriptors.close(fd, f"replica {record.replica_id}'s pidfd or FIFO")
            return None
        return cls(record, pidfd, fds[2], out, err, leader)


class Records:
    """The records of the replicas this node's agent runs, in ``root`` (the agent's own folder, 0700)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def of(cls, state_dir: Path) -> Records:
        """The records of the agent whose state dir is ``state_dir``."""
        return cls(state_dir / "replicas")

    def folder(self, replica_id: str) -> Path:
        """The replica's folder (made 0700 if missing): its record and FIFOs."""
        if not _ID.match(replica_id):
            raise ValueError(f"replica id {replica_id!r} is not one the agent keeps a record of")
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        folder = self.root / replica_id
        folder.mkdir(mode=0o700, exist_ok=True)
        return folder

    def write(self, record: Record) -> None:
        path = self.folder(record.replica_id) / RECORD
        partial = path.with_suffix(".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.json.encode(record))
        os.replace(partial, path)

    def remove(self, replica_id: str) -> None:
        if _ID.match(replica_id):
            remove_tree(self.root / replica_id)

    def load(self, *, clean: bool = True) -> tuple[dict[str, Record], dict[str, Record]]:
        """The records whose replica still runs and is the one started, and those whose replica ended (by replica
        id); with ``clean``, every record not in the first is removed, with the reason in the log."""
        found: dict[str, Record] = {}
        ended: dict[str, Record] = {}
        if not self.root.is_dir() or self.root.is_symlink():
            return found, ended
        for folder in sorted(self.root.iterdir()):
            try:
                if folder.is_symlink() or not _ID.match(folder.name):
                    raise ValueError("not a replica's folder")
                record = _decoder.decode((folder / RECORD).read_bytes())
                if record.replica_id != folder.name:
                    raise ValueError(f"it names replica {record.replica_id!r}")
                if record.pid > 1 and start_time(record.pid) != record.start_time:
                    ended[record.replica_id] = record
                    raise ValueError(f"its process {record.pid} ended while no agent watched it")
                if why := not_ours(record):
                    raise ValueError(why)
            except (OSError, ValueError, msgspec.DecodeError) as exc:
                if clean:
                    log.warning("replica record %s dropped: %s", folder.name, exc)
                    if folder.is_symlink():
                        folder.unlink()
                    else:
                        remove_tree(folder)
                continue
            found[record.replica_id] = record
        return found, ended

    def held_paths(self) -> frozenset[str]:
        """The pastas' pid files and the NATS doors of the replicas still running: a sweep of a dead agent's leaves
        them to be adopted."""
        return frozenset(p for r in self.load(clean=False)[0].values() for p in (r.pasta_pid_file, r.door) if p)

    async def stop(self, record: Record, grace_s: float) -> None:
        """Stop a running replica no slot adopted (no longer assigned here, or the agent stops): SIGTERM to its
        group (it drains), SIGKILL after ``grace_s``; then its record."""
        try:
            pidfd = os.pidfd_open(record.pid)
        except OSError:
            pidfd = -1
        if pidfd >= 0 and not not_ours(record):  # checked once the pidfd holds it: the pidfd is that process's
            leaders.signal_group(pidfd, record.pid, signal.SIGTERM)
            loop = asyncio.get_running_loop()
            exited = asyncio.Event()
            loop.add_reader(pidfd, exited.set)
            try:
                await asyncio.wait_for(exited.wait(), grace_s)
            except TimeoutError:
                leaders.signal_group(pidfd, record.pid, signal.SIGKILL)
            finally:
                loop.remove_reader(pidfd)
        if pidfd >= 0:
            os.close(pidfd)
        self.remove(record.replica_id)


class Adoptions:
    """The replicas a killed agent left running, read at this agent's start, until each is adopted by its slot or
    stopped."""

    def __init__(self, records: Records, network: netns.Network | None) -> None:
        self.records = records
        self._network = network  # this node's sandboxes' networks: the doors of those with a network of their own
        self.pending: dict[str, Record] = {}
        self.ended: dict[str, Record] = {}  # replicas that ended while no agent ran: their restart is said

    def load(self) -> None:
        self.pending, self.ended = self.records.load()
        if self.pending:
            log.info("%d replica(s) of the agent before still run, to be adopted: %s", len(self.pending),
                     ", ".join(sorted(self.pending)))

    async def take(self, key: Any, bundle_sha256: str, grace_s: float) -> Adopted | Record | None:
        """The running replica of slot ``key`` (a ``SlotKey``), adopted, when one of this version runs; the record
        of one that ended while no agent ran (the slot starts it again, as after a crash); None otherwise (one of
        another version or bundle under this id is stopped)."""
        record = self.pending.pop(key.replica_id, None)
        if record is None:
            return self.ended.pop(key.replica_id, None)
        if (record.app, record.service, record.version, record.index, record.bundle_sha256) != \
                (key.app, key.service, key.version, key.index, bundle_sha256):
            await self.stop(record, grace_s)
            return None
        adopted = await Adopted.take(self.records.folder(record.replica_id), record)
        if adopted is None:
            self.records.remove(record.replica_id)
            netns.release(record.pasta_pid_file, record.door)
        elif record.pasta_pid_file or record.door:
            netns.readopt(record.pid, record.pasta_pid_file, record.door, self._network)
        return adopted

    async def stop_unwanted(self, wanted: set[str], grace_s: float) -> None:
        """Stop the pending replicas this node's assignment no longer holds (they drain, as removed replicas do)."""
        doomed = [r for rid, r in self.pending.items() if rid not in wanted]
        for record in doomed:
            del self.pending[record.replica_id]
            log.info("stopping %s: a replica of the agent before, no longer assigned here", record.replica_id)
        await asyncio.gather(*(self.stop(r, grace_s) for r in doomed))

    async def stop(self, record: Record, grace_s: float) -> None:
        await self.records.stop(record, grace_s)
        netns.release(record.pasta_pid_file, record.door)
