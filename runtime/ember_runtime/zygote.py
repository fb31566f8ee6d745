"""A zygote: ``python -m ember_runtime.zygote ...``, started by the node agent for one function version.

It imports the app and runs the class's ``@ember.setup(snap=True)`` methods once (imports, model
construction, weights in host memory; nothing that touches a GPU), then forks a replica for each request
the agent sends over a Unix socket. A forked replica starts with all of that already in memory: it pays a
fork and its per-replica ``@ember.setup`` methods instead of an interpreter, imports and weight loading.

The zygote stays single-threaded and never runs an event loop, so that nothing which breaks across a fork
(threads, loops, sockets) is inherited: the child closes what the zygote holds, takes the stdout and stderr
the agent passed along with the request, and starts its own NATS connection, loop and model thread.

Protocol (``SOCK_SEQPACKET``, one connection per fork, one JSON message each way and then one more):
the agent sends a ``ForkRequest`` with two file descriptors (the child's stdout and stderr); the zygote
answers a ``ForkReply`` with the child's pid, and later an ``ExitReport`` once it has reaped the child.
"""

from __future__ import annotations

import argparse
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
from dataclasses import dataclass
from typing import Any

import msgspec

from ember._loader import find_app, import_app_module
from ember._wire import ServiceSpec

log = logging.getLogger("ember.zygote")
MAX_MESSAGE = 1 << 16
EXIT_FORK_FAILED = 70


class ForkRequest(msgspec.Struct, frozen=True, kw_only=True):
    argv: list[str]  # the replica's arguments, as ``python -m ember_runtime.replica`` takes them
    env: dict[str, str] = {}  # set in the child before anything runs (CUDA_VISIBLE_DEVICES and the like)
    cpus: list[int] = []  # pin the child to these CPUs; empty: inherit


class ForkReply(msgspec.Struct, frozen=True, kw_only=True):
    pid: int = 0
    error: str = ""


class ExitReport(msgspec.Struct, frozen=True, kw_only=True):
    code: int  # as ``Popen.returncode``: negative for a signal


class Ready(msgspec.Struct, frozen=True, kw_only=True):
    """The zygote's first line on stdout, once it can fork."""

    pid: int
    imports_s: float
    snap_setup_s: float
    rss_mb: int


@dataclass(frozen=True)
class Preloaded:
    """What a forked replica inherits from its zygote instead of importing and preparing it itself."""

    service: ServiceSpec
    target: Any
    prepared: Any
    snap_setup_s: float


def build(args: argparse.Namespace) -> tuple[Preloaded, Ready]:
    from ember_runtime._endpoint import prepare

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


def serve(listener: socket.socket, preloaded: Preloaded) -> None:
    """Fork a replica per request until SIGTERM; report each child's exit to whoever asked for it."""
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
        while not stopping:
            for key, _ in sel.select(timeout=1.0):
                if key.fileobj is listener:
                    with contextlib.suppress(OSError):
                        conn, _ = listener.accept()
                        child = _fork(conn, preloaded, listener, sel, children, (wake_r, wake_w))
                        if child:
                            children[child] = conn
                        else:
                            conn.close()
                else:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 512)
            _reap(children)
    for conn in children.values():  # the replicas live on, supervised by the agent
        conn.close()


def _fork(conn: socket.socket, preloaded: Preloaded, listener: socket.socket, sel: selectors.BaseSelector,
          children: dict[int, socket.socket], wake: tuple[int, int]) -> int:
    conn.settimeout(5.0)
    fds: list[int] = []
    try:
        data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 2)
        request = msgspec.json.decode(data, type=ForkRequest)
        if len(fds) != 2:
            raise ValueError(f"expected the child's stdout and stderr, got {len(fds)} descriptors")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    except Exception as exc:
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            conn.sendall(msgspec.json.encode(ForkReply(error=f"{type(exc).__name__}: {exc}")))
        return 0
    if pid == 0:  # the child: never returns
        code = EXIT_FORK_FAILED
        try:
            sel.close()
            listener.close()
            for other in children.values():
                other.close()
            signal.set_wakeup_fd(-1)
            for fd in wake:
                os.close(fd)
            code = _become_replica(request, fds, conn, preloaded)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    for fd in fds:
        os.close(fd)
    conn.sendall(msgspec.json.encode(ForkReply(pid=pid)))
    return pid


def _become_replica(request: ForkRequest, fds: list[int], conn: socket.socket, preloaded: Preloaded) -> int:
    from ember_runtime import replica

    conn.close()
    os.setsid()  # its own session, as a fresh replica has: the agent signals the whole group
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        os.close(fd)
    _close_channels()
    os.environ.update(request.env)
    if request.cpus and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, request.cpus)
    _apply_thread_count()
    return replica.main(request.argv, preloaded=preloaded)


def _close_channels() -> None:
    """Close every inherited socket and pipe but stdio: the zygote's own (from whoever started it, or opened
    by the app's imports) must not stay open in its replicas, where they would keep the other end waiting
    for an end of file that never comes. Files (weights, libraries) stay open."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
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


def _reap(children: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
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
    sys.stdout.write(msgspec.json.encode(ready).decode() + "\n")
    sys.stdout.flush()
    log.info("ready: imports %.2fs, snap setup %.2fs, %d MB", ready.imports_s, ready.snap_setup_s, ready.rss_mb)
    serve(listener, preloaded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
