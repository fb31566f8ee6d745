"""A zygote: ``python -m ember_runtime.zygote ...``, started by the node agent for one function version.

It imports the app and runs the class's ``@ember.setup(snap=True)`` methods once (imports, model
construction, weights in host memory; nothing that touches a GPU), then forks a replica for each request
the agent sends over a Unix socket. A forked replica starts with all of that already in memory: it pays a
fork and its per-replica ``@ember.setup`` methods instead of an interpreter, imports and weight loading.

The zygote stays single-threaded and never runs an event loop, so that nothing which breaks across a fork
(threads, loops, sockets) is inherited: the child closes what the zygote holds, takes the stdout and stderr
the agent passed along with the request, and starts its own NATS connection, loop and model thread.

Protocol (``SOCK_SEQPACKET``, one connection per replica, one JSON message each way and then one more):
the agent sends a ``ForkRequest`` with two file descriptors (the child's stdout and stderr); the zygote
answers a ``ForkReply`` with the child's pid, and later an ``ExitReport`` once it has reaped the child.
The child was forked before the request came (see ``serve``).
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
import sys
import time
import traceback
from typing import Any

import msgspec

from ember import _loop as ember_loop
from ember._loader import find_app, import_app_module
from ember.wire.jetstream import connect, ensure_buckets
from ember_runtime.replica import process as replica  # what every child runs: imported once, here, not after each fork
from ember_runtime.replica.endpoint import prepare
from ember_runtime.replica.process import Preloaded
from ember_runtime.zygote.protocol import MAX_MESSAGE, READY_PREFIX, ExitReport, ForkReply, ForkRequest, Ready

log = logging.getLogger("ember.zygote")
EXIT_FORK_FAILED = 70


def build(args: argparse.Namespace) -> tuple[Preloaded, Ready]:
    ember_loop.loop_factory()  # imports uvloop, which each child's event loop needs

    started = time.time()
    module = import_app_module(args.bundle, args.module)
    app = find_app(module, args.app)
    service = app.services[args.service]
    imported = time.time()
    prepared = prepare(service, app.target(args.service))
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


def serve(listener: socket.socket, preloaded: Preloaded, nats_url: str) -> None:
    """Hand a replica to each request until SIGTERM; report each child's exit to whoever asked for it.

    The zygote keeps one child forked ahead of time, a *spare*, waiting for its request: a fork of a
    process holding torch takes several milliseconds, and the spare has also done, before anyone asks,
    what every child does first (its own session, inherited channels closed). A request is passed to the
    spare, and the next spare is forked after the answer, off the caller's path."""
    stopping = False

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
    with selectors.DefaultSelector() as sel:
        sel.register(listener, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)

        def close_in_child() -> None:
            sel.close()
            listener.close()
            for conn in children.values():
                conn.close()
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)

        spare: Spare | None = None
        while not stopping:
            if spare is None or not spare.alive:
                spare = Spare.fork(preloaded, nats_url, close_in_child)
            for key, _ in sel.select(timeout=1.0):
                if key.fileobj is listener:
                    with contextlib.suppress(OSError):
                        conn, _ = listener.accept()
                        if spare is None or not spare.alive:  # a second request in the same wake-up
                            spare = Spare.fork(preloaded, nats_url, close_in_child)
                        if spare.take(conn):
                            children[spare.pid] = conn
                            spare = None
                        else:
                            conn.close()
                else:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 512)
            _reap(children, spare)
        if spare is not None:
            spare.close()
    for conn in children.values():  # the replicas live on, supervised by the agent
        conn.close()


class Spare:
    """A child forked ahead of a request, blocked until the zygote passes one to it (or goes away)."""

    def __init__(self, pid: int, channel: socket.socket) -> None:
        self.pid = pid
        self.alive = True
        self._channel = channel

    @classmethod
    def fork(cls, preloaded: Preloaded, nats_url: str, close_in_child: Any) -> Spare:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = EXIT_FORK_FAILED
            try:
                close_in_child()
                ours.close()
                code = _wait_then_serve(theirs, preloaded, nats_url)
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        theirs.close()
        return cls(pid, ours)

    def take(self, conn: socket.socket) -> bool:
        """Pass the request waiting on ``conn`` (and its descriptors) to this spare; answer the caller."""
        conn.settimeout(5.0)
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 2)
            msgspec.json.decode(data, type=ForkRequest)  # refuse a bad request here, not in the child
            if len(fds) != 2:
                raise ValueError(f"expected the child's stdout and stderr, got {len(fds)} descriptors")
            socket.send_fds(self._channel, [data], fds)
            conn.sendall(msgspec.json.encode(ForkReply(pid=self.pid)))
        except Exception as exc:
            with contextlib.suppress(OSError):
                conn.sendall(msgspec.json.encode(ForkReply(error=f"{type(exc).__name__}: {exc}")))
            return False
        finally:
            for fd in fds:
                os.close(fd)
        self._channel.close()
        return True

    def close(self) -> None:
        self._channel.close()  # the spare sees the end of its channel and exits


def _wait_then_serve(channel: socket.socket, preloaded: Preloaded, nats_url: str) -> int:
    os.setsid()  # its own session, as a fresh replica has: the agent signals the whole group
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _close_channels(keep=channel.fileno())
    return ember_loop.run(_spare(channel, preloaded, nats_url))


async def _spare(channel: socket.socket, preloaded: Preloaded, nats_url: str) -> int:
    """Connect to NATS and open the buckets, then wait for a request and become the replica it describes.
    Nothing here touches a device: ``CUDA_VISIBLE_DEVICES`` and the rest come with the request."""
    loop = asyncio.get_running_loop()
    nc = await connect(nats_url, f"ember-replica-spare-{os.getpid()}")
    stores = await ensure_buckets(nc.jetstream())
    channel.setblocking(False)
    asked: asyncio.Future[None] = loop.create_future()

    def on_request() -> None:
        if not asked.done():
            asked.set_result(None)

    loop.add_reader(channel.fileno(), on_request)
    await asked
    loop.remove_reader(channel.fileno())
    data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE, 2)
    channel.close()
    if not data:  # the zygote stopped (or died) before this spare was needed
        await nc.close()
        return 0
    request = msgspec.json.decode(data, type=ForkRequest)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        os.close(fd)
    os.environ.update(request.env)
    if request.cpus and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, request.cpus)
    _apply_thread_count()
    return await replica.serve(replica.parse_args(request.argv), preloaded, nc, stores)


def _close_channels(keep: int) -> None:
    """Close every inherited socket and pipe but stdio and ``keep``: the zygote's own (from whoever started
    it, or opened by the app's imports) must not stay open in its replicas, where they would keep the other
    end waiting for an end of file that never comes. Files (weights, libraries) stay open."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2 or fd == keep:
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.fstat(fd).st_mode) or stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.close(fd)


def _apply_thread_count() -> None:
    """Thread-count variables take effect when a library starts, which happened in the zygote: apply the
    child's to torch again (the agent sets OMP_NUM_THREADS to the CPUs a replica is pinned to)."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _reap(children: dict[int, socket.socket], spare: Spare | None) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if spare is not None and pid == spare.pid:
            spare.alive = False  # it died unused; the loop forks another
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
    p.add_argument("--socket", required=True, help="the Unix socket to listen on for fork requests")
    p.add_argument("--nats", required=True, help="NATS URL: each spare child connects before it is asked for")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.socket)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(args.socket)
    listener.listen(64)
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
    serve(listener, preloaded, args.nats)
    return 0

