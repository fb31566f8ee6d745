"""A zygote: ``python -m ember_runtime.zygote ...``, started by the node agent for one function version.

It imports the app and runs the class's ``@ember.setup(snap=True)`` methods once (imports, model
construction, weights in host memory; nothing that touches a GPU), then forks a replica for each request
the agent sends over a Unix socket. A forked replica starts with all of that already in memory: it pays a
fork and its per-replica ``@ember.setup`` methods instead of an interpreter, imports and weight loading.

The zygote stays single-threaded and never runs an event loop, so that nothing which breaks across a fork
(threads, loops, sockets) is inherited: the child closes what the zygote holds, takes the stdout and stderr
the agent passed along with the request, and starts its own NATS connection, loop and model thread.

Protocol (``SOCK_SEQPACKET``, one connection per replica): the agent sends a ``ForkRequest`` with two file
descriptors (the child's stdout and stderr); the zygote passes it, with the connection, to a child forked
before the request came (see ``serve``); the child answers a ``ForkReply`` (with it the kernel tells the agent
the child's pid on the node, which a sandboxed child cannot know), the agent answers that pid, and the child
goes on to become the replica. The zygote sends an ``ExitReport`` once it has reaped the child. A refused
request gets a ``ForkReply`` with an error from the zygote itself.

Only the agent may ask: the agent bound the socket where no sandbox sees it and handed over the listening
descriptor (``--listen-fd``), every child closes it, and each caller's credentials are checked (its uid is the
zygote's, and it is the agent: outside the zygote's pid namespace, or its parent when not sandboxed). The
zygote and its children stop when the agent's lifeline (``--lifeline-fd``) closes: the agent is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import resource
import selectors
import signal
import socket
import stat
import struct
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import msgspec

from ember import _gc
from ember import _loop as ember_loop
from ember._loader import find_app, import_app_module
from ember_runtime import hostpid, warm
from ember_runtime.batching.modelthread import ModelThread
from ember_runtime.replica import arguments
from ember_runtime.replica import process as replica  # what every child runs: imported once, here, not after each fork
from ember_runtime.replica.endpoint import Preloaded, prepare
from ember_runtime.zygote.protocol import (
    MAX_MESSAGE,
    MAX_SPARES,
    READY_PREFIX,
    ExitReport,
    ForkReply,
    ForkRequest,
    Ready,
    Request,
    Spares,
)

log = logging.getLogger("ember.zygote")
EXIT_FORK_FAILED = 70


def build(args: argparse.Namespace) -> tuple[Preloaded, Ready]:
    ember_loop.loop_factory()  # imports uvloop, which each child's event loop needs
    arguments.parser()  # each child only parses its arguments

    started = time.time()
    module = import_app_module(args.bundle, args.module)
    app = find_app(module, args.app)
    service = app.services[args.service]
    imported = time.time()
    prepared = prepare(service, app.target(args.service))
    _gc.settle()  # before the forks: its children share these objects' pages, which no collection then writes to
    done = time.time()
    rss_mb = _rss_mb()
    return (Preloaded(service, app.target(args.service), prepared, done - imported),
            Ready(pid=os.getpid(), imports_s=imported - started, snap_setup_s=done - imported, rss_mb=rss_mb))


def _rss_mb() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def serve(listener: socket.socket, preloaded: Preloaded, nats_url: str, lifeline: int = -1, spares: int = 1) -> None:
    """Hand a replica to each request until SIGTERM; report each child's exit to whoever asked for it.

    The zygote keeps ``spares`` children forked ahead of time, waiting for their requests: a fork of a
    process holding torch takes several milliseconds, and a spare has also done, before anyone asks,
    what every child does first (its own session, inherited channels closed). A request is passed to a
    spare, and the next spare is forked after the answer, off the caller's path; a burst of as many
    requests as there are spares is handed over without a fork. The agent may change the count
    (``Spares``). It stops when the agent's ``lifeline`` closes, as on SIGTERM."""
    stopping = False
    target = _spares(spares)

    def on_term(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd hears of exits
    signal.signal(signal.SIGTERM, on_term)
    children: dict[int, socket.socket] = {}
    waiting: list[Spare] = []
    with selectors.DefaultSelector() as sel:
        sel.register(listener, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        if lifeline >= 0:
            sel.register(lifeline, selectors.EVENT_READ)

        def close_in_child() -> None:
            sel.close()
            listener.close()
            for conn in children.values():
                conn.close()
            for spare in waiting:
                spare.close()
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)

        def fork() -> Spare:
            return Spare.fork(preloaded, nats_url, close_in_child, lifeline)

        while not stopping:
            waiting[:] = [spare for spare in waiting if spare.alive]
            while len(waiting) > target:  # fewer wanted: the extra ones exit
                waiting.pop().close()
            if len(waiting) < target:
                waiting.append(fork())  # one per turn: a request that comes meanwhile waits for one fork at most
            for key, _ in sel.select(timeout=0 if len(waiting) < target else 1.0):
                if key.fileobj is listener:
                    with contextlib.suppress(OSError):
                        conn, _ = listener.accept()
                        if not _from_agent(conn):
                            _refuse(conn, "only the node agent may ask this zygote for a replica")
                            continue
                        target = _answer(conn, waiting, fork, children, target)
                elif key.fileobj == lifeline:
                    stopping = True  # the agent is gone
                else:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 512)
            _reap(children, waiting)
        for spare in waiting:
            spare.close()
    for conn in children.values():  # the replicas live on, supervised by the agent
        conn.close()


def _spares(count: int) -> int:
    return min(max(count, 1), MAX_SPARES)


def _answer(conn: socket.socket, waiting: list[Spare], fork: Callable[[], Spare], children: dict[int, socket.socket],
            target: int) -> int:
    """Answer the agent's message on ``conn``: a request for a replica goes to a waiting spare (one forked now if
    none waits), a new count of spares is taken. The count of spares wanted from now on."""
    conn.settimeout(5.0)
    fds: list[int] = []
    try:
        data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 2)
        message = msgspec.json.decode(data, type=Request)  # refuse a bad request here, not in the child
        if isinstance(message, Spares):
            conn.sendall(msgspec.json.encode(Spares(count=_spares(message.count))))
            conn.close()
            return _spares(message.count)
        if len(fds) != 2:
            raise ValueError(f"expected the child's stdout and stderr, got {len(fds)} descriptors")
        if not waiting:  # a second request in the same wake-up, or more than the spares
            waiting.append(fork())
        spare = waiting.pop(0)
        spare.take(conn, data, fds)
        children[spare.pid] = conn
    except Exception as exc:
        _refuse(conn, f"{type(exc).__name__}: {exc}")
    finally:
        for fd in fds:
            os.close(fd)
    return target


class Spare:
    """A child forked ahead of a request, blocked until the zygote passes one to it (or goes away)."""

    def __init__(self, pid: int, channel: socket.socket) -> None:
        self.pid = pid
        self.alive = True
        self._channel = channel

    @classmethod
    def fork(cls, preloaded: Preloaded, nats_url: str, close_in_child: Any, lifeline: int = -1) -> Spare:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = EXIT_FORK_FAILED
            try:
                close_in_child()
                ours.close()
                code = _wait_then_serve(theirs, preloaded, nats_url, lifeline)
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        theirs.close()
        return cls(pid, ours)

    def take(self, conn: socket.socket, data: bytes, fds: list[int]) -> None:
        """Pass the request ``data`` (and its descriptors ``fds``, and ``conn`` itself, on which it came) to this
        spare, which answers the caller. The caller closes its own copies of ``fds``."""
        try:
            socket.send_fds(self._channel, [data], [*fds, conn.fileno()])
        finally:
            self._channel.close()

    def close(self) -> None:
        self._channel.close()  # the spare sees the end of its channel and exits


def _from_agent(conn: socket.socket) -> bool:
    """Whether the caller is the node agent: the zygote's own user, and either outside the zygote's pid
    namespace (its pid reads 0 here: the zygote is sandboxed) or the zygote's parent (it is not)."""
    ucred = struct.Struct("iII")
    try:
        pid, uid, _ = ucred.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, ucred.size))
    except OSError:
        return False
    return uid == os.getuid() and pid in (0, os.getppid())


def _refuse(conn: socket.socket, why: str) -> None:
    with contextlib.suppress(OSError):
        conn.settimeout(1.0)
        conn.sendall(msgspec.json.encode(ForkReply(error=why)))
    conn.close()


def _wait_then_serve(channel: socket.socket, preloaded: Preloaded, nats_url: str, lifeline: int = -1) -> int:
    os.setsid()  # its own session, as a fresh replica has: the agent signals the whole group
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _close_channels(keep={channel.fileno(), lifeline})
    return ember_loop.run(_spare(channel, preloaded, nats_url, lifeline))


async def _spare(channel: socket.socket, preloaded: Preloaded, nats_url: str, lifeline: int = -1) -> int:
    """Wait for a request and become the replica it describes. Nothing here touches a device or NATS:
    ``CUDA_VISIBLE_DEVICES``, the replica's own NATS credentials and the rest come with the request (a replica
    connects as itself, which it is only once asked). What does not depend on the request is made while it
    waits: the replica's model thread (started threads do not survive a fork, so the zygote cannot make it)."""
    loop = asyncio.get_running_loop()
    model_thread = ModelThread()
    channel.setblocking(False)
    asked: asyncio.Future[None] = loop.create_future()

    def on_request() -> None:
        if not asked.done():
            asked.set_result(None)

    loop.add_reader(channel.fileno(), on_request)
    if lifeline >= 0:  # the agent gone while this spare waits: no request will come (whatever its channel says)
        loop.add_reader(lifeline, on_request)
    await asked
    loop.remove_reader(channel.fileno())
    if lifeline >= 0:
        loop.remove_reader(lifeline)
    try:
        data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE, 3)
    except BlockingIOError:  # woken by the lifeline alone
        data, fds = b"", []
    channel.close()
    if not data or len(fds) != 3:  # the zygote stopped (or died), or the agent went, before this spare was needed
        for fd in fds:
            os.close(fd)
        model_thread.shutdown(wait=False)
        return 0
    request = msgspec.json.decode(data, type=ForkRequest)
    with socket.socket(fileno=fds[2]) as conn:  # the agent's connection: answer, and learn the pid on the node
        conn.settimeout(hostpid.ASK_TIMEOUT_S)
        host_pid = hostpid.ask(conn, msgspec.json.encode(ForkReply(pid=os.getpid())))
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds[:2]:
        os.close(fd)
    os.environ.update(request.env)
    os.environ[hostpid.ENV] = str(host_pid)
    if lifeline >= 0:
        loop.add_reader(lifeline, _agent_gone, loop, lifeline)
    if request.cpus and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):  # a thread's own: this one's, and the model thread made before
            os.sched_setaffinity(0, request.cpus)
            os.sched_setaffinity(model_thread.native_id, request.cpus)
    warm.apply_thread_count()
    return await replica.serve(replica.parse_args(request.argv), preloaded, model_thread)


def _agent_gone(loop: asyncio.AbstractEventLoop, lifeline: int) -> None:
    """The agent's lifeline closed: the replica drains and stops, as on the agent's own SIGTERM."""
    loop.remove_reader(lifeline)
    os.kill(os.getpid(), signal.SIGTERM)


def _close_channels(keep: set[int]) -> None:
    """Let go of every inherited socket and pipe but stdio and ``keep``: the zygote's own (from whoever started
    it, or opened by the app's imports) must not stay open in its replicas, where they would keep the other
    end waiting for an end of file that never comes. Files (weights, libraries) stay open.

    Each is replaced by /dev/null under its number rather than closed: a Python object of the app (a socket, a
    pipe's file) may own that number and close it later, which would then close whatever the replica had opened
    under it meanwhile (its NATS connection, its event loop's own descriptors)."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd <= 2 or fd in keep or fd == null:
                continue
            with contextlib.suppress(OSError):
                mode = os.fstat(fd).st_mode
                if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
                    os.dup2(null, fd, inheritable=False)  # the channel's last reference here goes
    finally:
        os.close(null)


def _reap(children: dict[int, socket.socket], waiting: list[Spare]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if spare := next((s for s in waiting if s.pid == pid), None):
            spare.alive = False  # it died unused (or was let go); the loop forks another if one is wanted
            spare.close()
            continue
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(msgspec.json.encode(ExitReport(code=os.waitstatus_to_exitcode(status))))
            conn.close()


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ember_runtime.zygote")
    p.add_argument("--bundle", required=True, help="unpacked bundle folder")
    p.add_argument("--module", required=True)
    p.add_argument("--app", required=True)
    p.add_argument("--service", required=True)
    p.add_argument("--listen-fd", type=int, required=True,
                   help="the listening Unix socket (bound by the agent) on which fork requests come")
    p.add_argument("--lifeline-fd", type=int, default=-1, help="closes when the agent is gone: stop")
    p.add_argument("--nats", required=True, help="NATS URL (unused: each replica is told its own)")
    p.add_argument("--spares", type=int, default=1,
                   help=f"children kept forked ahead of their requests (1 to {MAX_SPARES})")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    hostpid.learn()
    listener = socket.socket(fileno=args.listen_fd)
    try:
        preloaded, ready = build(args)
    except Exception:
        log.exception("snap setup failed")
        return 3
    sys.stdout.write(READY_PREFIX + msgspec.json.encode(ready).decode() + "\n")
    sys.stdout.flush()
    log.info("ready: imports %.2fs, snap setup %.2fs, %d MB", ready.imports_s, ready.snap_setup_s, ready.rss_mb)
    import gc
    gc.freeze()
    serve(listener, preloaded, args.nats, args.lifeline_fd, args.spares)
    return 0

