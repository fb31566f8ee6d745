"""A warm start's process (see ``ember_runtime.warm``): ``python -m ember_runtime.hostpid ember_runtime.replica.warm
--replica-id warm-... --identity-fd N [--preimport torch,...]``, started by the node agent (``agent/warm_starts.py``).

It imports what every replica imports and the libraries it was told, collects and freezes that heap (``_gc.settle``:
the replica's own settle at the end of its start then scans only its app's objects, not torch's 170,000), says so
on stdout (``READY_LINE``, then which of ``MODULES`` it holds), then reads its ``Identity`` from ``--identity-fd`` up
to the end of the pipe and becomes that replica. The pipe closed without an identity ends it."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
import time

import msgspec

from ember import _gc
from ember import _loop as ember_loop
from ember_runtime.replica import arguments
from ember_runtime.replica import process as replica
from ember_runtime.warm import MAX_IDENTITY, MODULES, READY_LINE, Identity, apply_thread_count, imported

log = logging.getLogger("ember.warm")


def _read(fd: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_IDENTITY:
            raise ValueError(f"an identity over {MAX_IDENTITY} bytes")
    return b"".join(chunks)


def preimport(names: list[str]) -> None:
    """Import what the app will: each of ``names`` that is one of ``MODULES`` and found in this environment. One
    that fails is left for the app's own import, which then says why."""
    for name in names:
        if name not in MODULES:
            continue
        started = time.monotonic()
        try:
            importlib.import_module(name)
        except Exception as exc:  # the app's own import reports it, in its replica's log
            log.info("warm start: %s not imported ahead: %s: %s", name, type(exc).__name__, exc)
            continue
        log.debug("warm start: %s imported in %.2fs", name, time.monotonic() - started)


def become(identity: Identity) -> int:
    """Run the replica ``identity`` describes, in this process: as ``python -m ember_runtime.replica`` would."""
    os.environ.update(identity.env)
    if identity.cpus and hasattr(os, "sched_setaffinity"):
        for thread in os.listdir("/proc/self/task"):  # the libraries' imports may have started threads
            with contextlib.suppress(OSError, ValueError):
                os.sched_setaffinity(int(thread), identity.cpus)
    apply_thread_count()
    importlib.invalidate_caches()  # /bundle was empty when the interpreter first looked at it
    return replica.main(identity.argv)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ember_runtime.replica.warm")
    p.add_argument("--replica-id", required=True, help="this warm start's own name, until a replica takes it")
    p.add_argument("--identity-fd", type=int, required=True, help="the replica's Identity comes here, then EOF")
    p.add_argument("--preimport", default="", help=f"comma-separated, of {', '.join(MODULES)}")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    ember_loop.loop_factory()  # uvloop
    arguments.parser()
    preimport([name for name in args.preimport.split(",") if name])
    _gc.settle()  # the imports' heap, collected and frozen ahead: the replica's own settle scans only its app's
    sys.stdout.write(f"{READY_LINE} {','.join(imported())}\n")  # and what it holds now (torch brings numpy)
    sys.stdout.flush()
    try:
        data = _read(args.identity_fd)
    finally:
        os.close(args.identity_fd)
    if not data:  # let go of before a replica took it
        return 0
    return become(msgspec.json.decode(data, type=Identity))


if __name__ == "__main__":
    sys.exit(main())
