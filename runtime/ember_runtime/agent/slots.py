"""A replica slot: keeps one replica process of a service version running, restarting it with backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

from ember.wire import LogLine, ReplicaStatus, encoder, subjects
from ember_runtime.agent import adoption, descriptors, launch, reap, sandbox
from ember_runtime.agent.cgroups import MemoryCgroups
from ember_runtime.agent.forked import ForkedProcess
from ember_runtime.agent.leaders import Leader
from ember_runtime.agent.memory_watch import Reservation
from ember_runtime.agent.warm_starts import WarmError, WarmStarts, template_of
from ember_runtime.agent.zygote_pool import ZygoteError, ZygotePool
from ember_runtime.exit_codes import SETUP_FAILURES
from ember_runtime.warm import Identity

log = logging.getLogger("ember.agent")

BACKOFF_START_S = 0.25
BACKOFF_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0  # a replica that ran this long resets the backoff
MAX_FAILED_SETUPS = 3  # setups failed in a row after which the replica is failed and no longer restarted
FAILED_REPORT_S = 5.0  # how often a failed replica's status is written again (the bucket forgets it otherwise)
STOP_GRACE_S = 25.0
SLOW_STOP_S = 2.0  # a replica that takes longer to drain and exit is named in the agent's log
ZYGOTE_WAIT_S = 120.0  # how long a start waits for its version's zygote to finish building
MAX_LOG_LINE = 16 * 1024  # bytes of one output line kept; the rest of the line is cut, and says so
_READ_CHUNK = 64 * 1024


def unforkable(confinement: sandbox.Confinement, gpus: Sequence[str], zygote_gpus: Sequence[str]) -> str:
    """Why a replica held so, given ``gpus``, cannot be forked from its version's zygote, which holds
    ``zygote_gpus``; "" when it can. A forked replica stays in its zygote's sandbox, which binds the device nodes of
    the zygote's GPUs alone: a sandboxed replica given other GPUs would not reach them (nor should it reach the
    zygote's), so it starts fresh, or from a warm start, whose sandbox holds its GPUs."""
    if not confinement.sandbox.enabled or sorted(gpus) == sorted(zygote_gpus):
        return ""
    if not zygote_gpus:
        return "the zygote's sandbox holds no GPU device nodes, and this replica's GPUs need theirs"
    return f"the zygote's sandbox holds GPU(s) {', '.join(zygote_gpus)}, not this replica's {', '.join(gpus)}"


Running = asyncio.subprocess.Process | ForkedProcess | sandbox.SandboxedProcess | adoption.Adopted


@dataclass(frozen=True)
class SlotKey:
    app: str
    service: str
    version: int
    index: int
    replica_id: str


class ReplicaSlot:
    """Owns one replica process at a time and the task that supervises it.

    ``gpu_uuids`` and ``gpu_memory_mb`` are the replica's GPU memory reservation (per GPU; 0: whole GPUs),
    which the agent's usage watch holds it to; ``cpus`` are the CPUs it is pinned to (None: not pinned).
    """

    def __init__(self, key: SlotKey, *, nc: Any, replicas_kv: Any, nats_url: str, node_id: str, bundle: Path,
                 module: str, env: dict[str, str], first_start: tuple[str, float, float],
                 gpu_uuids: Sequence[str] = (), gpu_memory_mb: int = 0, cpus: frozenset[int] | None = None,
                 zygotes: ZygotePool | None = None, startup_timeout_s: float = 0.0,
                 confinement: sandbox.Confinement = sandbox.NOT_CONFINED,
                 verify: Callable[[], Awaitable[Path]] | None = None, python: Path | None = None,
                 records: adoption.Records | None = None, adopt: adoption.Adopted | adoption.Record | None = None,
                 bundle_sha256: str = "", warm: WarmStarts | None = None) -> None:
        self.key = key
        self._warm = warm  # the node's warm starts: a fresh start takes its app's, where the node holds one
        self._records = records  # where a fresh start is recorded, for a restarted agent to adopt it
        self._adopted = adopt if isinstance(adopt, adoption.Adopted) else None  # the first "start" adopts it
        self._bundle_sha256 = bundle_sha256
        self._lifeline = -1  # the write end of the running replica's lifeline (see ``adoption``)
        self._python = str(python) if python is not None else sys.executable  # its image's interpreter, or ours
        self._first_start = first_start  # (kind, decided at, fetch seconds) of the first start
        self.replica_id = key.replica_id
        self._env = env
        self._nc = nc
        self._kv = replicas_kv
        self._nats_url = nats_url
        self._node_id = node_id
        self._bundle = bundle
        self._module = module
        self._proc: Running | None = None
        self._leader = Leader(0, -1)  # the running process's pidfd: its group is signalled through it, never by number
        self._stopping = asyncio.Event()
        self._stderr_tail: deque[str] = deque(maxlen=20)
        self.restarts = 0
        self.enforced_restarts = 0  # restarts for using more GPU memory than reserved
        self._restart_reason = ""  # why the agent killed the running process, when it did
        self._last_restart_reason = ""  # why the previous process ended, passed on to the next one
        self._gpu_uuids = tuple(gpu_uuids)
        self._gpu_memory_mb = gpu_memory_mb
        self._cpus = cpus
        self._zygotes = zygotes  # where a ready zygote of this version is found, when the node holds one
        self._said_unforkable = False  # its log says once why it is not forked from the zygote the node holds
        self._startup_timeout_s = startup_timeout_s
        self._jail = confinement
        self.warm_template = template_of(key.app, self._python, env, confinement) if warm is not None else None
        self._began_warm = False  # the running process began as a warm start
        self._fresh_next = False  # the next start is a fresh one: a process begun warm failed before it was healthy
        self._hellos: set[asyncio.Task[None]] = set()
        self._verify = verify  # the bundle, checked (and unpacked again if it changed) before a fresh start
        self._cgroup: Path | None = None
        self._task: asyncio.Task[None] | None = None
        if isinstance(adopt, adoption.Adopted):  # a replica a killed agent started, running still
            self.restarts = adopt.record.restarts
            self._cgroup = Path(adopt.record.cgroup) if adopt.record.cgroup else None
        elif adopt is not None:  # one that ended while no agent ran: this start is its restart, and says so
            self.restarts = adopt.restarts + 1
            self._last_restart_reason = "it ended while its node agent was away (exit code not known)"
            MemoryCgroups.remove(Path(adopt.cgroup) if adopt.cgroup else None)

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"slot-{self.replica_id}")

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the replica and the processes it started (its process group: it drains, they stop), SIGKILL
        them after ``grace_s``; then whatever is left of the group; then forget it."""
        self._stopping.set()
        proc, leader = self._proc, self._leader
        if proc is not None and proc.returncode is None:
            leader.signal_group(signal.SIGTERM)
            started = time.monotonic()
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                log.warning("replica %s still ran %.0fs after SIGTERM: killed", self.replica_id, grace_s)
                leader.signal_group(signal.SIGKILL)
                await proc.wait()
            else:
                if (took := time.monotonic() - started) > SLOW_STOP_S:
                    log.info("replica %s took %.1fs to stop", self.replica_id, took)
        if proc is not None:
            leader.signal_group(signal.SIGKILL)  # children that outlived the replica (closed once it ran: done)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._release()
        with contextlib.suppress(Exception):
            await self._kv.delete(subjects.replica_key(self._node_id, self.replica_id))

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return self._gpu_uuids

    def reservation(self) -> Reservation | None:
        """The running process, its GPUs and the GPU memory it reserved on each (0: it holds them whole); None when
        not running or without GPUs."""
        proc = self._proc
        if not self._gpu_uuids or proc is None or proc.returncode is not None or self._stopping.is_set():
            return None
        return Reservation(replica_id=self.replica_id, pid=proc.pid, devices=self._gpu_uuids,
                           memory_mb=self._gpu_memory_mb)

    async def restart(self, reason: str, *, pid: int) -> bool:
        """Kill process ``pid`` and its process group, if it is still this slot's, and say why everywhere:
        the agent's log, the replica's log stream, and its status while it restarts."""
        proc = self._proc
        if proc is None or proc.pid != pid or proc.returncode is not None or self._stopping.is_set():
            return False
        self._restart_reason = reason  # what the supervisor reports when it sees the process exit
        self._leader.signal_group(signal.SIGKILL)  # a replica leads its own session: its workers go too
        self.enforced_restarts += 1
        log.error("%s (enforced restart %d)", reason, self.enforced_restarts)
        await self._publish("agent", reason)
        return True

    async def _supervise(self) -> None:
        failures = failed_setups = 0
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                code: int | None = await self._run_once()
            except Exception as exc:  # no process: its sandbox, network or bundle failed it; said, and tried again
                code, self._restart_reason = None, f"could not start: {type(exc).__name__}: {exc}"
                MemoryCgroups.remove(self._cgroup)
            if self._stopping.is_set():
                return
            healthy = time.monotonic() - started > HEALTHY_AFTER_S
            failures = 1 if healthy else failures + 1
            self._fresh_next = self._began_warm and not healthy  # it may hold what another app imports: not again
            failed_setups = failed_setups + 1 if code in SETUP_FAILURES else 0
            reason = self._restart_reason or self._exit_reason(code if code is not None else 0)
            self._restart_reason = ""
            if failed_setups >= MAX_FAILED_SETUPS:
                await self._give_up(f"setup failed {failed_setups} times in a row; not restarted until the next "
                                    f"version: {reason}")
                return
            self.restarts += 1
            self._last_restart_reason = reason
            log.warning("replica %s %s; restart %d", self.replica_id,
                        reason if code is None else f"exited ({reason})", self.restarts)
            await self._report_crash(reason)
            delay = min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** (failures - 1))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def _run_once(self) -> int:
        kind, decided, fetch_s = self._first_start if self.restarts == 0 else ("artifact", time.time(), 0.0)
        if (adopted := self._adopted) is not None:
            self._proc, self._adopted, self._lifeline = adopted, None, adopted.lifeline
            self._leader = adopted.leader  # its pidfd, opened before the process was checked to be the one started
            log.info("replica %s adopted (pid %d)", self.replica_id, adopted.pid)
        else:
            self._began_warm = False
            self._proc = await self._fork(decided) or await self._from_warm(decided, fetch_s) \
                or await self._spawn(kind, decided, fetch_s)
            self._leader = Leader.open(self._proc.pid)  # a running process's number (a warm start: checked at its take)
        leader = self._leader
        assert self._proc.stdout is not None and self._proc.stderr is not None
        pumps = [asyncio.create_task(self._pump(self._proc.stdout, "stdout")),
                 asyncio.create_task(self._pump(self._proc.stderr, "stderr"))]
        proc = self._proc
        try:
            return await proc.wait()
        finally:
            leader.signal_group(signal.SIGKILL)  # what a crashed replica started dies with it
            leader.close()
            if proc.returncode is None:  # a stop cancelled the wait: its exit is waited for all the same
                await launch.exited(proc)
            await asyncio.gather(*pumps, return_exceptions=True)
            MemoryCgroups.remove(self._cgroup)
            self._release()

    def _release(self) -> None:
        """The replica ended (or is stopped): its lifeline let go, its record removed."""
        descriptors.close(self._lifeline, f"the write end of replica {self.replica_id}'s lifeline")
        self._lifeline = -1
        if self._records is not None:
            self._records.remove(self.replica_id)

    def _argv(self, kind: str, decided: float, fetch_s: float) -> list[str]:
        """``ember_runtime.replica``'s arguments for this start."""
        k = self.key
        bundle = sandbox.BUNDLE if self._jail.sandbox.enabled else str(self._bundle)
        return ["--nats", self._nats_url, "--bundle", bundle, "--module", self._module, "--app", k.app,
                "--service", k.service, "--version", str(k.version), "--replica-id", self.replica_id,
                "--node-id", self._node_id, "--restarts", str(self.restarts),
                f"--restart-reason={self._last_restart_reason}", "--start-kind", kind,
                "--decided-at", repr(decided), "--fetch-s", repr(fetch_s),
                "--startup-timeout-s", repr(self._startup_timeout_s)]

    async def _spawn(self, kind: str, decided: float,
                     fetch_s: float) -> asyncio.subprocess.Process | sandbox.SandboxedProcess:
        """A fresh interpreter (in its sandbox, where the node has them): it imports the app and runs all of its
        setup. Its bundle is checked first; it joins its memory cgroup before it runs anything."""
        if self._verify is not None:
            self._bundle = await self._verify()
        jail = self._jail
        self._cgroup = jail.cgroups.prepare(f"replica-{self.replica_id}", jail.memory_mb) if jail.cgroups else None
        pipes = self._pipes()
        preexec = partial(sandbox.prepare_child, self._cpus, cgroup=MemoryCgroups.joiner(self._cgroup),
                          outlive_agent=pipes is not None)
        env = sandbox.environment(self._env, sandboxed=jail.sandbox.enabled, secrets=jail.secrets)
        env.update(pipes.env if pipes is not None else {})
        command = [self._python, "-m", "ember_runtime.hostpid", "ember_runtime.replica",
                   *self._argv(kind, decided, fetch_s)]
        out: dict[str, Any] = {"stdout": asyncio.subprocess.PIPE, "stderr": asyncio.subprocess.PIPE}
        if pipes is not None:
            out = {"stdout": pipes.writes[0], "stderr": pipes.writes[1]}
        try:
            proc = await self._start_process(command, env, preexec, out, pipes.pass_fds if pipes else ())
        except BaseException:
            if pipes is not None:
                pipes.close()
            raise
        if pipes is not None:
            try:
                proc.stdout, proc.stderr = pipes.started()
            except BaseException:  # nobody would read it or know of it: it must not run on unseen
                reap.kill_group(proc.pid)  # a number just given out, not waited for yet
                pipes.close()
                await launch.exited(proc)
                raise
            self._lifeline = pipes.lifeline
            self._record(proc, pipes.nonce)
        return proc

    def _pipes(self) -> adoption.Pipes | None:
        """The FIFOs of a start that a restarted agent can adopt; None: a start that ends with the agent."""
        if self._records is None:
            return None
        try:
            return adoption.Pipes(self._records.folder(self.replica_id))
        except (OSError, ValueError) as exc:
            log.warning("replica %s will not outlive this agent: %s", self.replica_id, exc)
            return None

    async def _start_process(self, command: list[str], env: dict[str, str], preexec: Callable[[], None],
                             out: dict[str, Any], keep: Sequence[int]) -> launch.Started:
        return await launch.start(command, env, preexec, out, keep, confinement=self._jail, bundle=self._bundle,
                                  name=self.replica_id, hellos=self._hellos)

    def _record(self, proc: launch.Started, nonce: str, command_id: str = "") -> None:
        """What a restarted agent needs to find this replica again and adopt it (see ``adoption``)."""
        assert self._records is not None
        started = adoption.start_time(proc.pid)
        if started is None:  # it ended already: nothing to adopt
            return
        k = self.key
        self._records.write(adoption.Record(
            replica_id=k.replica_id, app=k.app, service=k.service, version=k.version, index=k.index,
            bundle_sha256=self._bundle_sha256, pid=proc.pid, start_time=started, nonce=nonce, restarts=self.restarts,
            cgroup=str(self._cgroup or ""), pasta_pid_file=getattr(proc, "pasta_pid_file", ""),
            door=getattr(proc, "door", ""), command_id=command_id))

    async def _from_warm(self, decided: float, fetch_s: float) -> launch.Started | None:
        """A replica from a warm start (``warm_starts``), where the node holds one of its key; None otherwise, after a
        replica begun warm failed before it was healthy (a warm start may hold libraries another app of its key
        imports), and when the hand-over fails (said on its log stream: it starts fresh)."""
        template, warm_starts = self.warm_template, self._warm
        if template is None or warm_starts is None or self._records is None or self._fresh_next:
            return None
        warm = warm_starts.take(template.key)
        if warm is None:
            return None
        try:
            if self._verify is not None:
                self._bundle = await self._verify()
            identity = Identity(argv=self._argv("warm", decided, fetch_s), cpus=sorted(self._cpus or ()),
                                env={"PYTHONUNBUFFERED": "1", **self._env, **self._jail.secrets})
            await warm.give(self._records, self.replica_id, self._bundle, identity)
        except WarmError as exc:
            await self._publish("agent", f"replica {self.replica_id}: {exc}; starting it fresh")
            return None
        except BaseException:  # cancelled, or its bundle failed its check: the warm start is let go of
            await asyncio.shield(warm.stop())
            raise
        self._cgroup, self._lifeline = warm.cgroup, warm.lifeline
        proc = warm.proc
        proc.stdout, proc.stderr = warm.stdout, warm.stderr
        self._record(proc, warm.nonce, command_id=warm.name)
        self._began_warm = True
        return proc

    async def _fork(self, decided: float) -> ForkedProcess | None:
        """A replica forked from this version's zygote, when the node holds a ready one; None otherwise,
        and when the fork fails (the zygote is discarded, the failure counted, and the replica starts fresh)."""
        if self._zygotes is None:
            return None
        held = self._zygotes.gpus_of(self.key.app, self.key.service, self.key.version)
        if held is not None and (why := unforkable(self._jail, self._gpu_uuids, held)):
            if not self._said_unforkable:
                self._said_unforkable = True
                await self._publish("agent", f"replica {self.replica_id} starts fresh, not forked from its zygote: "
                                    f"{why}")
            return None
        gpus = self._gpu_uuids if self._jail.sandbox.enabled else None  # in a sandbox: a zygote of the same GPUs
        zygote = await self._zygotes.get(self.key.app, self.key.service, self.key.version, wait_s=ZYGOTE_WAIT_S,
                                         bundle_sha256=self._bundle_sha256, gpus=gpus)
        if zygote is None:
            return None
        argv = self._argv("zygote", decided, 0.0)
        jail = self._jail
        self._cgroup = jail.cgroups.prepare(f"replica-{self.replica_id}", jail.memory_mb) if jail.cgroups else None
        try:
            return await zygote.fork(argv, {"PYTHONUNBUFFERED": "1", **self._env, **jail.secrets}, self._cpus,
                                     cgroup=self._cgroup)
        except ZygoteError as exc:
            await self._publish("agent", f"replica {self.replica_id}: could not fork from the zygote ({exc}); "
                                         "starting it fresh")
            return None

    async def _pump(self, stream: asyncio.StreamReader, name: Literal["stdout", "stderr"]) -> None:
        async for line in output_lines(stream):
            if name == "stderr" and line.strip():
                self._stderr_tail.append(line)
            await self._publish(name, line)

    async def _publish(self, stream: Literal["stdout", "stderr", "agent"], line: str) -> None:
        """One line of the replica's log stream (``agent``: what the agent did to it)."""
        with contextlib.suppress(Exception):
            await self._nc.publish(subjects.logs(self.key.app, self.key.service, self._node_id), encoder.encode(
                LogLine(replica_id=self.replica_id, stream=stream, line=line, ts=time.time())))

    def _exit_reason(self, code: int) -> str:
        if isinstance(self._proc, adoption.Adopted):
            return "ended (adopted from the agent before: its exit code is not known)"
        what = sandbox.how_it_ended(code)
        last = self._stderr_tail[-1] if self._stderr_tail and code > 0 else ""
        return f"{what}: {last}" if last else what

    async def _give_up(self, reason: str) -> None:
        """Leave the replica failed, saying why, until the slot is stopped (a new version, or the app deleted)."""
        log.error("replica %s: %s", self.replica_id, reason)
        await self._publish("agent", reason)
        while not self._stopping.is_set():
            await self._report_crash(reason, state="failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), FAILED_REPORT_S)

    async def _report_crash(self, reason: str, state: Literal["crashed", "failed"] = "crashed") -> None:
        now = time.time()
        status = ReplicaStatus(replica_id=self.replica_id, node_id=self._node_id, app=self.key.app,
                               service=self.key.service, version=self.key.version, state=state,
                               pid=self._proc.pid if self._proc else 0, started_at=now, updated_at=now,
                               restarts=self.restarts, message=reason[:500])
        with contextlib.suppress(Exception):
            await self._kv.put(subjects.replica_key(self._node_id, self.replica_id), encoder.encode(status))


async def output_lines(stream: asyncio.StreamReader, max_line: int = MAX_LOG_LINE) -> AsyncIterator[str]:
    """A process's output, line by line, each cut to ``max_line`` bytes: the pipe is always read to its end
    (a reader that stopped at an overlong line would leave the process blocked on a full pipe)."""
    pending, dropped = b"", 0
    while chunk := await stream.read(_READ_CHUNK):
        *lines, rest = (pending + chunk).split(b"\n")
        for raw in lines:
            yield _cut(raw, max_line, dropped)
            dropped = 0
        pending = rest[:max_line]
        dropped += len(rest) - len(pending)
    if pending or dropped:
        yield _cut(pending, max_line, dropped)


def _cut(raw: bytes, max_line: int, dropped: int) -> str:
    dropped += max(len(raw) - max_line, 0)
    line = raw[:max_line].decode(errors="replace")
    return f"{line} [... {dropped} more bytes of this line not kept]" if dropped else line
