"""The node agent's warm starts (see ``ember_runtime.warm``): fresh starts begun ahead, with the heavy libraries
the node's apps import already imported, which the next fresh start of the same environment and sandbox takes
instead of starting an interpreter.

- **When.** A replica reports ready with the libraries it imported (``StartPhases.modules``, in each status it
  writes after); the agent then keeps one warm start of its key (below), importing those (with those other apps of
  the key reported), while the node's assignment holds an app whose replica reported it within ``FORGET_S``, and
  while the node holds fewer than ``limit`` keys (first come). A taken one is replaced at once, off the caller's
  path.
- **What it is.** Exactly what a fresh start of an app with that key would get: its interpreter (its image's
  environment), its sandbox (read-only binds, volumes, ``block_network``) and network, its memory cgroup and limit,
  its environment, its FIFOs and lifeline (so that, once taken, the replica outlives the agent and is adopted like
  any fresh one). What a replica is given at the take is not part of the key: its app, version and arguments (its
  identity), its NATS credentials and secrets, its CPUs (its thread counts are: libraries size their pools as they
  are imported). A start whose key differs (an image that changed, other GPUs, other volumes, another memory limit)
  starts fresh as before. A replica with GPUs takes only a warm start begun with the same device nodes and
  ``CUDA_VISIBLE_DEVICES`` (on a node with one GPU, every replica of the key); a warm start imports torch and the
  like, which open no device.
- **Whose it is.** No app's until its take: nothing of any app has run in it (no bundle, identity, credentials or
  secret is there before), so the first start of an app the node never ran takes it too, when its key is one the
  node keeps (the same image, sandbox and limits as an app that ran here). What another app can change of it is
  which of ``MODULES`` it imports, from its environment: the taker holds them in its own memory limit (about
  220 MB resident with torch) until its process ends, and a replica begun warm that fails within
  ``slots.HEALTHY_AFTER_S`` starts fresh next. Its folder is in the agent's 0700 state dir, like every replica's;
  ``ember status`` shows it to the apps that asked for it.
- **The bundle.** The sandbox binds an empty folder of the warm start's own at ``/bundle``, read-only; at the take
  the agent fills it with the version's unpacked bundle (hard links into the bundle cache, read-only in the sandbox),
  and the folder becomes the replica's record folder (its FIFOs are there), removed when the replica ends.
- **What it costs.** The memory of its imports, which the node's host memory reservations do not count: so a warm
  start begins only while the kernel says ``min_available_mb`` (1.5 GB) is available (``MemAvailable``) and the
  replicas' reservations leave ``WARM_MB`` of the node's memory, and the node lets go of its warm starts when less
  than half of ``min_available_mb`` is available. And one start's CPU after each take; none while it waits. A
  replica forked from a zygote asks for none, nor does a version whose zygote the node holds (``asks``).
  ``--warm-starts 0`` turns them off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from ember.wire import StartPhases
from ember.wire.natscreds import CREDS_ENV
from ember_runtime.agent import adoption, launch, sandbox
from ember_runtime.agent.bundles import remove_tree
from ember_runtime.agent.cgroups import MemoryCgroups
from ember_runtime.agent.leaders import Leader
from ember_runtime.agent.numa import HostMemory
from ember_runtime.warm import MODULES, READY_LINE, Identity

log = logging.getLogger("ember.agent")

DEFAULT_LIMIT = 2  # warm starts a node holds at once
MAX_FAILURES = 3  # warm starts of one key that died before a take, after which that key gets none
FORGET_S = 30.0  # a key whose replicas have not reported for this long (they all report every 5 s at most) goes
MIN_AVAILABLE_MB = 1536  # a warm start begins only while the node has this much memory available; half: let go
WARM_MB = 512  # what a warm start may hold (about 220 MB with torch): left by the replicas' reservations
# What differs between two replicas of one app on one node: given at the take, not part of the key. (Thread counts
# and the GPUs are part of it: libraries size their pools and look for devices as they are imported.)
PER_REPLICA_ENV = frozenset({CREDS_ENV})


class WarmError(Exception):
    """A warm start could not be handed over; the replica starts fresh instead."""


@dataclass(frozen=True)
class WarmKey:
    """What a fresh start gets on this node, but for what is given at the take (the app's identity among it): two
    starts of one key, of one app or of two, can take each other's warm start."""

    python: str
    env: tuple[tuple[str, str], ...]
    readonly: tuple[Path, ...]
    mounts: tuple[tuple[Path, str], ...]
    block_network: bool
    memory_mb: int
    devices: tuple[str, ...]  # the GPUs' device nodes bound in


@dataclass(frozen=True)
class Template:
    """How to start a warm start of ``key``: its environment (nothing per replica in it) and its confinement (no
    secrets); ``app``, whose start it describes, is not part of the key."""

    key: WarmKey
    app: str
    env: Mapping[str, str] = field(default_factory=dict)
    confinement: sandbox.Confinement = sandbox.NOT_CONFINED


def template_of(app: str, python: str, env: Mapping[str, str], confinement: sandbox.Confinement) -> Template:
    """The warm start a fresh start of ``app`` could take."""
    shared = {k: v for k, v in env.items() if k not in PER_REPLICA_ENV}
    key = WarmKey(python=python, env=tuple(sorted(shared.items())), readonly=confinement.readonly,
                  mounts=confinement.mounts, block_network=confinement.block_network, memory_mb=confinement.memory_mb,
                  devices=confinement.devices)
    return Template(key=key, app=app, env=shared, confinement=replace(confinement, secrets={}))


class WarmStart:
    """One warm start, waiting for its replica."""

    def __init__(self, key: WarmKey, modules: tuple[str, ...], name: str, folder: Path, proc: launch.Started,
                 pipes: adoption.Pipes, identity_w: int, cgroup: Path | None, stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader) -> None:
        self.key = key
        self.modules = modules  # what it imports ahead; once ready, which of MODULES it holds
        self.name = name  # its id until taken (``--replica-id`` on its command line)
        self.folder = folder
        self.proc = proc
        self.nonce = pipes.nonce
        self.lifeline = pipes.lifeline
        self.cgroup = cgroup
        self.stdout, self.stderr = stdout, stderr
        self.ready = False  # its imports are done
        self._identity_w = identity_w
        self._watch: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def watch(self) -> None:
        self._watch = asyncio.create_task(self._until_ready(), name=f"warm-{self.name}")

    async def _until_ready(self) -> None:
        with contextlib.suppress(ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            while line := await self.stdout.readline():
                said, _, holds = line.decode(errors="replace").strip().partition(" ")
                if said == READY_LINE:  # with which of MODULES it holds: what it was told, and what they imported
                    self.modules = tuple(m for m in MODULES if m in holds.split(",")) or self.modules
                    self.ready = True
                    return
                log.debug("warm start %s: %s", self.name, line.decode(errors="replace").rstrip())

    async def give(self, records: adoption.Records, replica_id: str, bundle: Path, identity: Identity) -> None:
        """Hand this warm start to replica ``replica_id``: its folder becomes the replica's, the bundle goes in, then
        the identity; the warm start is the replica's from here (``stop`` no longer applies)."""
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        if not self.alive:  # ended since the take checked (its folder and cgroup let go of here: it is no one's now)
            await self.stop()
            raise WarmError(f"warm start {self.name} ended (exit code {self.proc.returncode})")
        try:
            target = records.folder(replica_id)
            remove_tree(target)  # what an ended process of this replica left, if anything (0555 copies too)
            os.rename(self.folder, target)
            self.folder = target
            _fill(bundle, target / "bundle")
            await _write_all(self._identity_w, msgspec.json.encode(identity))
        except (OSError, ValueError) as exc:
            await self.stop()
            raise WarmError(f"warm start {self.name} could not be handed over: {exc}") from exc
        finally:
            _close(self._identity_w)
            self._identity_w = -1

    async def stop(self) -> None:
        """Let it go unused: its identity pipe closes (it exits), its group is killed if it does not, its folder and
        cgroup removed."""
        if self._watch is not None:
            self._watch.cancel()
        _close(self._identity_w)
        self._identity_w = -1
        _close(self.lifeline)
        self.lifeline = -1
        try:
            await asyncio.wait_for(self.proc.wait(), 5.0)
        except TimeoutError:
            leader = Leader.open(self.proc.pid)
            leader.signal_group(signal.SIGKILL)
            leader.close()
            await launch.exited(self.proc)
        remove_tree(self.folder)
        MemoryCgroups.remove(self.cgroup)


@dataclass
class Wanted:
    """A key the node keeps a warm start of: how to begin one, what it imports, and which apps' replicas asked (the
    last time each did)."""

    template: Template
    asked: dict[str, tuple[float, frozenset[str]]] = field(default_factory=dict)  # app -> (when, what it imports)

    @property
    def modules(self) -> tuple[str, ...]:
        """What its warm start imports: what its apps import, in ``MODULES``' order."""
        wanted = frozenset().union(*(imports for _, imports in self.asked.values()))
        return tuple(m for m in MODULES if m in wanted)


class WarmStarts:
    """The warm starts of this node: one per key that a running replica reported (two services whose sandboxes
    differ have a key each; two apps of one image and sandbox share one), at most ``limit`` keys, first come; a key
    no replica of a running app reported for ``FORGET_S`` is let go of."""

    def __init__(self, records: adoption.Records, limit: int = DEFAULT_LIMIT, *,
                 host_memory: HostMemory | None = None, min_available_mb: int = MIN_AVAILABLE_MB) -> None:
        self.limit = limit
        self.min_available_mb = min_available_mb
        self._host_memory = host_memory  # the replicas' reservations
        self._short = ""  # why no warm start begins now (memory), said once
        self._records = records
        self._held: dict[WarmKey, WarmStart] = {}
        self._wanted: dict[WarmKey, Wanted] = {}
        self._starting: dict[WarmKey, asyncio.Task[None]] = {}
        self._failures: dict[WarmKey, int] = {}
        self._hellos: set[asyncio.Task[None]] = set()
        self._tasks: set[asyncio.Future[Any]] = set()  # each warm start's exit watched; let go of ended ones

    def want(self, template: Template, modules: Iterable[str]) -> None:
        """Keep a warm start of ``template`` importing ``modules`` (those of ``MODULES`` only, with those the key's
        other apps reported), when the node has room: a replica of ``template.app`` reported them (at its ready, and
        in each status after)."""
        heavy = frozenset(m for m in MODULES if m in set(modules))
        key = template.key
        if not heavy or self.limit <= 0 or self._failures.get(key, 0) >= MAX_FAILURES:
            return
        wanted = self._wanted.get(key)
        if wanted is None:
            if len(self._wanted) >= self.limit:
                return
            wanted = self._wanted[key] = Wanted(template)
        wanted.asked[template.app] = (time.monotonic(), heavy)
        held = self._held.get(key)
        if held is None or not held.alive or (held.ready and not heavy <= set(held.modules)):  # begun again with them
            self._start(key)

    def take(self, key: WarmKey) -> WarmStart | None:
        """The warm start of ``key``, now the caller's; its replacement begins."""
        held = self._held.get(key)
        if held is None or not held.alive:
            return None
        del self._held[key]
        self._start(key)
        return held

    async def keep(self, apps: set[str]) -> None:
        """Let go of the warm starts whose apps this node no longer runs, or whose replicas did not report lately;
        of all of them when the node runs short of memory (``short``, at half of ``min_available_mb``)."""
        now = time.monotonic()
        short = self.short(self.min_available_mb // 2)
        for key, wanted in list(self._wanted.items()):
            wanted.asked = {app: asked for app, asked in wanted.asked.items()
                            if app in apps and now - asked[0] <= FORGET_S}
            if wanted.asked and not short:
                continue
            if short:
                self._say_short(short)
            del self._wanted[key]
            if (task := self._starting.pop(key, None)) is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            if (held := self._held.pop(key, None)) is not None:
                await held.stop()

    def short(self, min_available_mb: int | None = None) -> str:
        """Why the node has no room for a warm start now (too little memory available, or reserved by its
        replicas); "" when it has."""
        need = self.min_available_mb if min_available_mb is None else min_available_mb
        available = available_mb()
        if available is not None and available < need:
            return f"{available} MB of memory available, under {need} MB"
        held = self._host_memory
        if held is not None and held.total_mb and held.total_mb - held.reserved_mb < WARM_MB:
            return f"the replicas reserved {held.reserved_mb} MB of the node's {held.total_mb} MB"
        return ""

    def _say_short(self, short: str) -> None:
        if short != self._short:
            log.warning("no warm starts for now: %s", short)
        self._short = short

    def statuses(self) -> dict[str, str]:
        """By app that asked for one: ``ready`` (the imports of a warm start it may take are done) or ``starting``."""
        states: dict[str, str] = {}
        for key, warm in self._held.items():
            for app in self._wanted[key].asked if warm.alive and key in self._wanted else ():
                if states.get(app) != "ready":
                    states[app] = "ready" if warm.ready else "starting"
        return dict(sorted(states.items()))

    async def stop(self) -> None:
        await self.keep(set())
        for task in [*self._tasks, *self._hellos]:  # exits watched (taken ones' are their slots' now), hand-overs
            task.cancel()
        await asyncio.gather(*self._tasks, *self._hellos, return_exceptions=True)

    def _start(self, key: WarmKey) -> None:
        if key in self._starting or key not in self._wanted:
            return
        task = asyncio.create_task(self._replace(key), name="warm-start")
        self._starting[key] = task
        task.add_done_callback(lambda t: self._starting.pop(key, None) if self._starting.get(key) is t else None)

    async def _replace(self, key: WarmKey) -> None:
        template, modules = self._wanted[key].template, self._wanted[key].modules
        if (old := self._held.pop(key, None)) is not None:
            await old.stop()
        if short := self.short():  # asked again at its apps' next status
            self._say_short(short)
            return
        self._short = ""
        try:
            warm = await self._spawn(template, modules)
        except Exception as exc:  # its replicas start fresh; said once
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            log.warning("no warm start for %s (%d failed): %s: %s", _apps(self._wanted.get(key)), failures,
                        type(exc).__name__, exc)
            return
        self._held[key] = warm
        warm.watch()
        self._keep(asyncio.ensure_future(warm.proc.wait())).add_done_callback(partial(self._ended, warm))

    def _keep(self, task: asyncio.Future[Any]) -> asyncio.Future[Any]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _ended(self, warm: WarmStart, _: asyncio.Future[int]) -> None:
        """A warm start that ended before a take: counted, and replaced while its key has failures left."""
        if self._held.get(warm.key) is not warm:
            return  # taken, or let go of
        del self._held[warm.key]
        failures = self._failures[warm.key] = self._failures.get(warm.key, 0) + 1
        log.warning("warm start %s for %s ended (exit code %s) before a replica took it", warm.name,
                    _apps(self._wanted.get(warm.key)), warm.proc.returncode)
        self._keep(asyncio.ensure_future(warm.stop()))
        if failures < MAX_FAILURES:
            self._start(warm.key)

    async def _spawn(self, template: Template, modules: tuple[str, ...]) -> WarmStart:
        name = f"warm-{secrets.token_hex(8)}"
        folder = self._records.folder(name)
        bundle = folder / "bundle"
        bundle.mkdir(mode=0o755)
        conf = template.confinement
        cgroup = conf.cgroups.prepare(f"replica-{name}", conf.memory_mb) if conf.cgroups else None
        pipes = adoption.Pipes(folder)
        identity_r, identity_w = os.pipe()
        os.set_blocking(identity_w, False)
        try:
            env = sandbox.environment(template.env, sandboxed=conf.sandbox.enabled)
            env.update(pipes.env)
            command = [template.key.python, "-m", "ember_runtime.hostpid", "ember_runtime.replica.warm",
                       "--replica-id", name, "--identity-fd", str(identity_r), "--preimport", ",".join(modules)]
            preexec = partial(sandbox.prepare_child, None, cgroup=MemoryCgroups.joiner(cgroup), outlive_agent=True)
            proc = await launch.start(command, env, preexec, {"stdout": pipes.writes[0], "stderr": pipes.writes[1]},
                                      (*pipes.pass_fds, identity_r), confinement=conf, bundle=bundle, name=name,
                                      hellos=self._hellos)
        except BaseException:
            pipes.close()
            _close(identity_w)
            remove_tree(folder)
            MemoryCgroups.remove(cgroup)
            raise
        finally:
            _close(identity_r)
        stdout, stderr = pipes.started()
        log.info("warm start %s for %s: importing %s", name, _apps(self._wanted.get(template.key)), ", ".join(modules))
        return WarmStart(template.key, modules, name, folder, proc, pipes, identity_w, cgroup, stdout, stderr)


def asks(state: str, start: StartPhases, forks_here: bool) -> bool:
    """Whether a replica's status asks for a warm start: it is ready, its app imported some of ``MODULES``, and it
    did not fork from a zygote; nor does a version whose starts fork on this node (``forks_here``: its zygote is
    here, ready or building), whose first replica may have started fresh before its zygote was ready."""
    return state == "ready" and bool(start.modules) and start.kind != "zygote" and not forks_here


def available_mb() -> int | None:
    """The memory the kernel says new work can have without swapping (``MemAvailable``), in MB; None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _apps(wanted: Wanted | None) -> str:
    """The apps that asked for a key, for the agent's log."""
    return f"app {', '.join(sorted(wanted.asked))}" if wanted is not None and wanted.asked else "no app now"


def _fill(bundle: Path, into: Path) -> None:
    """``bundle``'s files in ``into``: hard links where both are on one file system, copies elsewhere."""
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(bundle, into, symlinks=True, copy_function=link, dirs_exist_ok=True)


async def _write_all(fd: int, data: bytes) -> None:
    """``data`` into the non-blocking pipe ``fd``, waiting (off the loop's turn) while the reader is busy."""
    view = memoryview(data)
    for _ in range(2000):  # 10 s at most: its imports may still run
        with contextlib.suppress(BlockingIOError):
            view = view[os.write(fd, view):]
        if not view:
            return
        await asyncio.sleep(0.005)
    raise OSError("the warm start did not read its identity within 10 s")


def _close(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)
