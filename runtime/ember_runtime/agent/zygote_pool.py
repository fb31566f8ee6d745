"""The node agent's zygotes: one preloaded process per function version the scheduler wants preloaded here.

A ``Zygote`` starts ``python -m ember_runtime.zygote`` and, once it reports ready, forks replicas from it
(see that module for the protocol). A zygote that fails to build, dies, or cannot fork is discarded with
an event (a log line at warning level and a count in its status) and the replica starts fresh; the pool
builds it again while the scheduler still wants it, with a growing delay after repeated failures.

A zygote runs in the same sandbox as a replica of its version (where the node has them), and its forked
replicas stay in it: the sandbox outlives the zygote while they run, and ends after them (``zygote_remains``).
So a zygote whose assignment names GPUs (``ZygoteAssignment.gpus``) has their device nodes in its sandbox, as a
replica on them has, and forks only the replicas given exactly those GPUs (``get``'s ``gpus``). Only the agent can
ask a zygote for a replica: the agent binds the zygote's socket in its own state dir (which no sandbox sees) and
hands the zygote the listening descriptor, which its forked children close; the zygote checks each caller's
credentials too. Zygotes and their replicas hold the read end of one pipe whose write end only the agent
holds (the *lifeline*): when the agent dies they see it close, and stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from ember.wire import SlotAssignment, ZygoteAssignment, ZygoteStatus
from ember_runtime import hostpid
from ember_runtime.agent import descriptors, reap, sandbox, zygote_socket
from ember_runtime.agent.cgroups import MemoryCgroups
from ember_runtime.agent.forked import ForkedProcess
from ember_runtime.agent.leaders import Leader
from ember_runtime.agent.zygote_remains import Remains, Teardowns, exit_code
from ember_runtime.agent.zygote_socket import ZygoteKey
from ember_runtime.zygote.protocol import MAX_MESSAGE, READY_PREFIX, ForkReply, ForkRequest, Ready, Spares

log = logging.getLogger("ember.agent")
Event = Callable[[str, str, str], None]  # (app, service, line): a zygote's failure, for the app's log stream
Mounts = Callable[[ZygoteAssignment], Awaitable[tuple[tuple[Path, str], ...]]]  # its volumes: (folder, mount path)
Verify = Callable[[str], Awaitable[Path]]  # a bundle's sha256 -> its unpacked folder, checked
DeviceNodes = Callable[[Sequence[str]], tuple[str, ...]]  # GPU uuids -> the device nodes a sandbox binds for them
BUILD_TIMEOUT_S = 600.0
RETRY_START_S = 1.0
RETRY_MAX_S = 60.0


@dataclass(frozen=True)
class Interpreter:
    """What a zygote of a version with an image runs: its environment's Python, what its sandbox must see read-only,
    the image's environment variables."""

    python: str
    readonly: tuple[Path, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


class ZygoteError(Exception):
    """A fork through a zygote failed; the replica starts fresh instead."""


class Zygote:
    """One zygote process: built from an unpacked bundle, then forking replicas on request."""

    def __init__(self, assignment: ZygoteAssignment, bundle: Path, socket_path: Path, nats_url: str,
                 on_event: Event | None = None, *, sandbox_: sandbox.Sandbox = sandbox.NO_SANDBOX,
                 lifeline: int = -1, verify: Verify | None = None, interpreter: Interpreter | None = None,
                 mounts: Mounts | None = None, devices: tuple[str, ...] = (), cgroups: MemoryCgroups | None = None,
                 teardowns: Teardowns | None = None) -> None:
        self.assignment = assignment
        self._cgroups = cgroups  # where the node allows it, the zygote's sandbox runs in a cgroup of its own
        self._teardowns = teardowns or Teardowns()
        self._remains: Remains | None = None  # its sandbox and cgroup, ended after it (see ``zygote_remains``)
        self._devices = devices  # the device nodes of its GPUs (``assignment.gpus``), bound into its sandbox
        self._mounts = mounts
        self._interpreter = interpreter or Interpreter(python=sys.executable)
        self._nats_url = nats_url
        self._on_event = on_event
        self.key: ZygoteKey = (assignment.app, assignment.service, assignment.version)
        self._bundle = bundle
        self._socket = socket_path
        self._sandbox = sandbox_
        self._lifeline = lifeline  # the read end of the agent's lifeline, handed to the zygote
        self._verify = verify
        self._proc: asyncio.subprocess.Process | sandbox.SandboxedProcess | None = None
        self._pid = 0  # the zygote's own pid on this node
        self._own = Leader(0, -1)  # the zygote process, held by a pidfd once its pid is known
        self._hello: asyncio.Task[None] | None = None
        self._ready: Ready | None = None
        self.state = "building"
        self.message = ""
        self.build_s = 0.0
        self.forks = 0
        self.failures = 0
        self.spares = assignment.spares  # the children it keeps forked ahead of their requests, as it was told
        self._output_tail: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self.settled = asyncio.Event()  # set once it is ready or has failed

    def start(self) -> None:
        self._task = asyncio.create_task(self._build(), name=f"zygote-{self.key}")

    @property
    def ready(self) -> bool:
        return self.state == "ready" and self._proc is not None and self._proc.returncode is None

    @property
    def done(self) -> bool:
        """The process is gone (built and died, or failed to build)."""
        return self._task is not None and self._task.done() and not self.ready

    async def _start(self) -> asyncio.subprocess.Process | sandbox.SandboxedProcess:
        """The zygote process, listening on the socket the agent bound, its pid on this node asked for."""
        if self._verify is not None:
            self._bundle = await self._verify(self.assignment.bundle_sha256)
        mounts = await self._mounts(self.assignment) if self._mounts is not None else ()
        listener = zygote_socket.listen(self._socket)
        ours, theirs = hostpid.socket_pair()
        fds = (listener.fileno(), theirs.fileno(), self._lifeline)
        enabled = self._sandbox.enabled
        bundle = sandbox.BUNDLE if enabled else str(self._bundle)
        cmd = [self._interpreter.python, "-m", "ember_runtime.zygote", "--bundle", bundle,
               "--module", self.assignment.module,
               "--app", self.assignment.app,
               "--service", self.assignment.service, "--listen-fd", str(listener.fileno()),
               "--lifeline-fd", str(self._lifeline), "--nats", self._nats_url, "--spares", str(self.spares)]
        env = {**sandbox.environment(dict(self._interpreter.env), sandboxed=enabled),
               hostpid.FD_ENV: str(theirs.fileno()), **sandbox.volume_env(mounts, sandboxed=enabled)}
        # its own cgroup, bounded as its replicas are (pids.max, memory.max): it runs the app's code
        name = f"zygote-{self._socket.stem}-{os.urandom(4).hex()}"  # a rebuild's own: the last one's may remain
        cgroup = self._cgroups.prepare(name, self.assignment.host_memory_mb) if self._cgroups is not None else None
        preexec = partial(sandbox.prepare_child, None, cgroup=MemoryCgroups.joiner(cgroup))
        try:
            if enabled:
                jail = sandbox.Jail(bundle=self._bundle, writable=sandbox.writable_folders(env), outlive_command=True,
                                    readonly=self._interpreter.readonly, mounts=mounts, devices=self._devices,
                                    block_network=self.assignment.block_network)
                proc: asyncio.subprocess.Process | sandbox.SandboxedProcess = await sandbox.start(
                    self._sandbox, cmd, jail, env, preexec, pass_fds=fds)
            else:
                proc = await asyncio.create_subprocess_exec(
                    *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, cwd=self._bundle, env=env, start_new_session=True,
                    pass_fds=fds, preexec_fn=preexec)
        except BaseException:
            ours.close()
            MemoryCgroups.remove(cgroup)
            raise
        finally:
            listener.close()
            theirs.close()
        self._remains = Remains(proc.pid if enabled else 0, cgroup)  # a sandbox's first process: a number just given
        self._hello = asyncio.create_task(self._learn_pid(ours), name=f"zygote-pid-{self.key}")
        return proc

    async def _learn_pid(self, sock: socket.socket) -> None:
        try:
            _, self._pid = await asyncio.wait_for(hostpid.answer(sock), BUILD_TIMEOUT_S)
            self._own = Leader.open(self._pid)  # it asks as it starts: a number just given out
        except (OSError, TimeoutError):
            pass
        finally:
            sock.close()

    def _kill(self) -> None:
        """SIGKILL the zygote process alone: the replicas it forked live on (in its sandbox, when it has one)."""
        if self._proc is None or self._proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self._pid:
                self._own.signal(signal.SIGKILL)  # a sandboxed zygote's parent is bwrap's init, which reaps it at once
            else:
                self._proc.send_signal(signal.SIGKILL)  # bwrap's init's group (a pidfd), or our unreaped child

    async def _build(self) -> None:
        started = time.time()
        try:
            self._proc = await self._start()
        except Exception as exc:
            self._fail(f"zygote {self._name} could not start: {type(exc).__name__}: {exc}")
            return
        assert self._proc.stdout is not None and self._proc.stderr is not None
        announced: asyncio.Future[Ready] = asyncio.get_running_loop().create_future()
        pumps = asyncio.gather(self._pump(self._proc.stdout, announced), self._pump(self._proc.stderr))
        try:
            self._ready = await asyncio.wait_for(asyncio.shield(announced), BUILD_TIMEOUT_S)
        except (TimeoutError, ZygoteError):
            self._kill()
            await exit_code(self._proc)
            await _drain(pumps)
            self._fail(f"zygote {self._name} failed to build: {self._last_error()}")
            return
        self.build_s = time.time() - started
        self.state = "ready"
        self.settled.set()
        log.info("zygote %s ready in %.2fs (imports %.2fs, snap setup %.2fs, %d MB)", self._name, self.build_s,
                 self._ready.imports_s, self._ready.snap_setup_s, self._ready.rss_mb)
        code = await exit_code(self._proc)
        await _drain(pumps)
        if self.state == "ready":  # not stopped by us
            how = f"was {sandbox.how_it_ended(code)}" if code < 0 else f"exited with code {code}: {self._last_error()}"
            self._fail(f"zygote {self._name} {how}")

    async def _pump(self, stream: asyncio.StreamReader, announced: asyncio.Future[Ready] | None = None) -> None:
        """Read one of the zygote's streams to its end (into the agent's debug log); on stdout, the line that
        announces it is ready (the app's own output may come before it)."""
        async for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            if announced is not None and not announced.done() and line.startswith(READY_PREFIX):
                with contextlib.suppress(msgspec.DecodeError):
                    announced.set_result(msgspec.json.decode(line.removeprefix(READY_PREFIX), type=Ready))
                    continue
            if line:
                self._output_tail = [*self._output_tail[-19:], line]
                log.debug("zygote %s: %s", self._name, line)
        if announced is not None and not announced.done():
            announced.set_exception(ZygoteError("the zygote closed its output before it was ready"))

    def _last_error(self) -> str:
        return self._output_tail[-1] if self._output_tail else "no output"

    def _fail(self, message: str) -> None:
        self.state, self.message = "failed", message
        self.settled.set()
        self.failures += 1
        log.warning("%s; replicas of it start fresh", message)
        if self._on_event is not None:
            self._on_event(self.assignment.app, self.assignment.service, f"{message}; replicas of it start fresh")

    @property
    def _name(self) -> str:
        app, service, version = self.key
        return f"{app}.{service} v{version}"

    async def fork(self, argv: Sequence[str], env: dict[str, str], cpus: frozenset[int] | None,
                   cgroup: Path | None = None) -> ForkedProcess:
        """Fork a replica with these arguments (``ember_runtime.replica``'s) and extra environment.

        The forked child answers itself; the kernel tells its pid on this node with the answer. It joins
        ``cgroup`` and learns that pid before it goes on to become the replica."""
        if not self.ready:
            raise ZygoteError(f"zygote {self._name} is {self.state}")
        loop = asyncio.get_running_loop()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            request = ForkRequest(argv=list(argv), env=env, cpus=sorted(cpus or ()))
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            conn.settimeout(5.0)
            zygote_socket.connect(conn, self._socket)
            socket.send_fds(conn, [msgspec.json.encode(request)], [out_w, err_w])
            conn.setblocking(False)
            data, pid = await asyncio.wait_for(hostpid.receive(conn, MAX_MESSAGE), 5.0)
            reply = msgspec.json.decode(data, type=ForkReply)
            if not reply.pid:
                raise ZygoteError(reply.error or "the zygote closed the connection")
            pid = pid or reply.pid
            MemoryCgroups.move(cgroup, pid)
            if self._remains is not None:
                self._remains.forked(pid)  # it waits to be told to go on: its number is its own
            await loop.sock_sendall(conn, str(pid).encode())  # go on: you are ``pid`` on this node
        except (OSError, TimeoutError, msgspec.DecodeError, ZygoteError) as exc:
            conn.close()
            _close_output(out_r, err_r, "read")
            self._fail(f"zygote {self._name} could not fork: {exc}")
            self._kill()  # discard it: the pool builds a new one
            raise ZygoteError(str(exc)) from exc
        except BaseException:  # cancelled: a child not told to go on sees its connection close and exits
            conn.close()
            _close_output(out_r, err_r, "read")
            raise
        finally:
            _close_output(out_w, err_w, "write")
        self.forks += 1
        try:  # one step from here: no cancel comes between the child going on and its output's readers
            out, err = descriptors.read_pipes((out_r, f"forked replica {pid}'s stdout pipe"),
                                              (err_r, f"forked replica {pid}'s stderr pipe"))
        except BaseException:  # the child went on: it must not run unseen
            reap.kill_group(pid)  # it leads its own session from before it is told to go on; forked just now
            conn.close()
            raise
        return ForkedProcess(pid, conn, out, err)

    async def keep_spares(self, count: int) -> None:
        """Tell the ready zygote how many children to keep forked ahead of their requests (``Spares``)."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.settimeout(5.0)
            zygote_socket.connect(conn, self._socket)
            conn.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(conn, msgspec.json.encode(Spares(count=count)))
            answer = await asyncio.wait_for(loop.sock_recv(conn, MAX_MESSAGE), 5.0)
            self.spares = msgspec.json.decode(answer, type=Spares).count
        except (OSError, TimeoutError, msgspec.DecodeError) as exc:
            log.warning("zygote %s kept %d spares, not %d: %s", self._name, self.spares, count, exc)
        finally:
            conn.close()

    async def stop(self) -> None:
        """Stop the zygote (the replicas it forked live on). One still being started has no process to signal yet:
        its start is abandoned (``sandbox.start`` kills what it began), else the build would go on to start it and
        then wait for an exit nobody asks for, and so would this stop and the agent's reconcile loop behind it."""
        self.state = "stopped"
        self.settled.set()
        if self._proc is None and self._task is not None:
            self._task.cancel()
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if self._pid:
                    self._own.signal(signal.SIGTERM)
                else:
                    self._proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(exit_code(self._proc), 5.0)
            except TimeoutError:
                self._kill()
        for task in (self._task, self._hello):
            if task is not None:
                if task is self._hello:
                    task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._own.close()
        with contextlib.suppress(FileNotFoundError):
            self._socket.unlink()
        self._teardowns.begin(self._remains)  # its sandbox ends once the replicas forked from it have
        self._remains = None

    def status(self) -> ZygoteStatus:
        app, service, version = self.key
        ready = self._ready
        state = self.state if self.state in ("building", "ready") else "failed"
        return ZygoteStatus(app=app, service=service, version=version, state=state,  # type: ignore[arg-type]
                            pid=(self._pid or ready.pid) if ready and self.ready else 0,
                            rss_mb=ready.rss_mb if ready else 0,
                            build_s=self.build_s, forks=self.forks, failures=self.failures, message=self.message,
                            spares=self.spares, gpus=self.assignment.gpus)


async def _drain(pumps: asyncio.Future[Any], grace_s: float = 2.0) -> None:
    """The rest of a zygote's output once it exited: what its sandbox's other processes (its replicas, which
    inherited nothing of it but bwrap's pid 1 did) may hold open is not waited for."""
    try:
        await asyncio.wait_for(asyncio.shield(pumps), grace_s)
    except TimeoutError:
        pumps.cancel()
        await asyncio.gather(pumps, return_exceptions=True)  # its cancellation retrieved: nothing logged at exit
    except Exception:
        pass


def _close_output(out: int, err: int, end: str) -> None:
    descriptors.close(out, f"the {end} end of a forked replica's stdout pipe")
    descriptors.close(err, f"the {end} end of a forked replica's stderr pipe")


class ZygotePool:
    """The zygotes this node holds: those in its assignment, built and rebuilt as needed."""

    def __init__(self, state_dir: Path, nats_url: str, on_event: Event | None = None, *,
                 sandbox_: sandbox.Sandbox = sandbox.NO_SANDBOX, verify: Verify | None = None,
                 mounts: Mounts | None = None, devices: DeviceNodes | None = None,
                 cgroups: Callable[[], MemoryCgroups | None] = lambda: None) -> None:
        self._dir = state_dir / "zygotes"
        self._cgroups = cgroups  # the node's, once the agent looked (None: zygotes run in the agent's cgroup)
        self._teardowns = Teardowns()
        self._devices = devices  # a zygote's GPUs -> their device nodes; None: its sandbox holds none
        self._mounts = mounts
        self._nats_url = nats_url
        self._on_event = on_event
        self._sandbox = sandbox_
        self._verify = verify
        # One lifeline for every zygote and replica forked here: only this process holds the write end, so the
        # read end closes when it dies, and never before (a zygote stopped here leaves its replicas running).
        self._lifeline, self._lifeline_w = os.pipe()
        self._zygotes: dict[ZygoteKey, Zygote] = {}
        self._failures: dict[ZygoteKey, int] = {}  # failed builds in a row, per version: the retry delay
        self._retry_at: dict[ZygoteKey, float] = {}

    async def get(self, app: str, service: str, version: int, *, wait_s: float = 0.0, bundle_sha256: str = "",
                  gpus: Sequence[str] | None = None) -> Zygote | None:
        """The ready zygote of this version, if this node holds one (of ``bundle_sha256``, where given: an app
        deleted and pushed again has versions of the same numbers; holding exactly ``gpus``, where given); one
        still building is waited for up to ``wait_s`` (its build costs about what a fresh start would, and a fork
        after it almost nothing)."""
        def fits(zygote: Zygote | None) -> bool:
            return zygote is not None and (not bundle_sha256 or zygote.assignment.bundle_sha256 == bundle_sha256) \
                and (gpus is None or sorted(zygote.assignment.gpus) == sorted(gpus))

        zygote = self._zygotes.get((app, service, version))
        if zygote is None or not fits(zygote):
            return None
        if wait_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(zygote.settled.wait(), wait_s)
        return zygote if zygote.ready and fits(self._zygotes.get((app, service, version))) else None

    def gpus_of(self, app: str, service: str, version: int) -> list[str] | None:
        """The GPUs whose device nodes the zygote of this version holds (ready or building); None: none held."""
        zygote = self._zygotes.get((app, service, version))
        return zygote.assignment.gpus if zygote is not None and not zygote.done else None

    def forks(self, app: str, service: str, version: int, gpus: Sequence[str] | None = None) -> bool:
        """Whether this node holds a zygote of this version (ready or building) that its next starts given ``gpus``
        fork from (any of them: None)."""
        held = self.gpus_of(app, service, version)
        return held is not None and (gpus is None or sorted(held) == sorted(gpus))

    async def reconcile(self, wanted: dict[ZygoteKey, tuple[ZygoteAssignment, Path]],
                        interpreters: Mapping[ZygoteKey, Interpreter] | None = None) -> None:
        """Build what is wanted and missing (or dead: after a delay), stop what is not; ``interpreters``: images'."""
        for key in [k for k in self._zygotes if k not in wanted]:
            log.info("removing zygote %s.%s v%d", *key)
            await self._zygotes.pop(key).stop()
            self._failures.pop(key, None)
            self._retry_at.pop(key, None)
        now = time.monotonic()
        for key, (assignment, bundle) in wanted.items():
            zygote = self._zygotes.get(key)
            if zygote is not None and (why := _moved(zygote.assignment, assignment)):
                log.info("replacing zygote %s.%s v%d: %s", *key, why)
                await self._zygotes.pop(key).stop()
                self._failures.pop(key, None)
                self._retry_at.pop(key, None)
                zygote = None
            if zygote is not None and not zygote.done:
                if zygote.ready:
                    self._failures.pop(key, None)
                    if zygote.spares != assignment.spares:  # the scheduler expects more starts here, or fewer
                        await zygote.keep_spares(assignment.spares)
                continue
            if zygote is not None:  # it failed or died: count it, and try again after a while
                if key not in self._retry_at:
                    failures = self._failures[key] = self._failures.get(key, 0) + 1
                    self._retry_at[key] = now + min(RETRY_MAX_S, RETRY_START_S * 2 ** (failures - 1))
                if now < self._retry_at[key]:
                    continue
            self._retry_at.pop(key, None)
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            replacement = Zygote(assignment, bundle, self._dir / zygote_socket.socket_name(key), self._nats_url,
                                 self._on_event, sandbox_=self._sandbox, lifeline=self._lifeline,
                                 verify=self._verify, interpreter=(interpreters or {}).get(key), mounts=self._mounts,
                                 devices=self._devices(assignment.gpus) if self._devices and assignment.gpus else (),
                                 cgroups=self._cgroups(), teardowns=self._teardowns)
            if zygote is not None:
                replacement.failures = zygote.failures
                await zygote.stop()
            log.info("building zygote %s.%s v%d", *key)
            self._zygotes[key] = replacement
            replacement.start()

    def statuses(self) -> list[ZygoteStatus]:
        return [z.status() for _, z in sorted(self._zygotes.items())]

    async def stop(self) -> None:
        """Stop the zygotes, then let go of the lifeline: replicas forked here that are still running stop too, and
        the zygotes' sandboxes end."""
        await asyncio.gather(*(z.stop() for z in self._zygotes.values()), return_exceptions=True)
        self._zygotes.clear()
        descriptors.close(self._lifeline_w, "the write end of the zygotes' lifeline")
        descriptors.close(self._lifeline, "the read end of the zygotes' lifeline")
        self._lifeline = self._lifeline_w = -1
        await self._teardowns.close()


def beside_another_app(zygote: ZygoteAssignment, slots: Iterable[SlotAssignment]) -> bool:
    """Whether one of the GPUs a zygote would hold is given to a replica of another app among ``slots`` (its node's
    assignment): a zygote runs its app's code, so the node builds none there (the control plane plans none either;
    this holds should an assignment say otherwise)."""
    return bool(set(zygote.gpus) & {uuid for s in slots if s.app != zygote.app for uuid in s.gpu_uuids})


def _moved(held: ZygoteAssignment, wanted: ZygoteAssignment) -> str:
    """Why a zygote held as ``held`` cannot be the one ``wanted``; "" when it can."""
    if held.bundle_sha256 != wanted.bundle_sha256:
        return "that version has another bundle now (its app was deleted and pushed again)"
    if sorted(held.gpus) != sorted(wanted.gpus):
        return f"its replicas start next on GPU(s) {', '.join(wanted.gpus) or 'none'}, not {', '.join(held.gpus)}"
    return ""
