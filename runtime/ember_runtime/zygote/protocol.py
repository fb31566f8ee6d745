"""What the node agent and a zygote say to each other: over the zygote's Unix socket (``SOCK_SEQPACKET``, one
connection per replica) a ``ForkRequest`` with the child's stdout and stderr, a ``ForkReply`` with its pid, and
later an ``ExitReport``; or, on a connection of its own, ``Spares``, answered with the same; on the zygote's stdout,
one ``Ready`` line once it can fork."""

from __future__ import annotations

import msgspec

MAX_MESSAGE = 1 << 16
READY_PREFIX = "ember-zygote-ready "  # the line on stdout that says it can fork (the app may print before it)


MAX_SPARES = 8  # children a zygote keeps forked ahead of their requests, at most


class ForkRequest(msgspec.Struct, frozen=True, kw_only=True, tag="fork"):
    argv: list[str]  # the replica's arguments, as ``python -m ember_runtime.replica`` takes them
    env: dict[str, str] = {}  # set in the child before anything runs (CUDA_VISIBLE_DEVICES and the like)
    cpus: list[int] = []  # pin the child to these CPUs; empty: inherit


class Spares(msgspec.Struct, frozen=True, kw_only=True, tag="spares"):
    """How many children the zygote keeps forked ahead of their requests (1 to ``MAX_SPARES``): the starts the
    scheduler expects on its node soon, each then a hand-over rather than a fork on the caller's path."""

    count: int


Request = ForkRequest | Spares


class ForkReply(msgspec.Struct, frozen=True, kw_only=True):
    pid: int = 0
    error: str = ""


class ExitReport(msgspec.Struct, frozen=True, kw_only=True):
    code: int  # as ``Popen.returncode``: negative for a signal


class Ready(msgspec.Struct, frozen=True, kw_only=True):
    """What the zygote announces on stdout (after ``READY_PREFIX``) once it can fork."""

    pid: int
    imports_s: float
    snap_setup_s: float
    rss_mb: int
