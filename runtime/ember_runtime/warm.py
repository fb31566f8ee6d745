"""A warm start: a replica's fresh start begun before anyone asked for it, its identity and bundle given later.

A fresh replica spends most of its start importing the libraries its app uses (torch alone is 1-1.5 s of CPU),
then setting the model up. A node agent that runs an app whose replicas imported such libraries keeps a *warm
start* of its key: the same sandbox, network, memory cgroup and interpreter a fresh start of the app gets, started
ahead, in which this module has imported those libraries (``MODULES``, the ones the key's apps' replicas reported)
and then waits. A new version's replica, a scale-up or a restart of the app, or the first start of another app of
the same image and sandbox, then takes it: the agent puts the version's bundle into the folder the sandbox sees as
``/bundle`` (empty until then) and writes an ``Identity`` (the replica's arguments, its environment with its NATS
credentials and secrets, its CPUs) to the descriptor ``--identity-fd``, then closes it. The process becomes that
replica: it imports the app and runs its setup as any fresh replica does, without the interpreter's start and
the libraries' imports.

Nothing of any app runs before the take (no bundle is there yet), and what the agent gives at the take never
reaches the process's command line or its initial environment (``/proc/<pid>/environ``): a warm start is no app's
until then, and becomes the taker's alone. The descriptor closed without an identity (the agent stopped it, or
died) ends it.

The process: ``python -m ember_runtime.hostpid ember_runtime.replica.warm --replica-id warm-... --identity-fd N
[--preimport torch]`` (``ember_runtime.replica.warm``); what it and the agent share is here.
"""

from __future__ import annotations

import builtins
import os
import sys
from collections.abc import Callable
from typing import Any

import msgspec

# The libraries a warm start may import ahead: slow to import, and the same for every version of an app. A replica
# reports which of them its app needs (``StartPhases.modules``, see ``Asked``); a warm start of its key imports those.
MODULES = ("numpy", "torch", "onnxruntime", "tensorrt", "transformers", "vllm")
READY_LINE = "ember-warm-ready"
MAX_IDENTITY = 1 << 20  # bytes: the replica's arguments and environment (secrets included)


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """What the agent gives a warm start when a replica takes it."""

    argv: list[str]  # the replica's arguments, as ``python -m ember_runtime.replica`` takes them
    env: dict[str, str] = {}  # set before anything of the app runs: NATS credentials, secrets, thread counts
    cpus: list[int] = []  # pin the process to these CPUs; empty: as it is


def imported() -> list[str]:
    """Which of ``MODULES`` this process has imported."""
    return [name for name in MODULES if name in sys.modules]


class Asked:
    """Which of ``MODULES`` an app needs, watched while it loads (``with Asked() as asked:`` around its import and
    setup): those its code imports (an ``import torch`` counts where a warm start imported torch before) and those
    imported meanwhile by any means. What a warm start imported and the app never asked for does not count: a replica
    begun from another app's warm start asks only for what its own app needs (``modules``)."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self._before = frozenset(imported())
        self._original: Callable[..., Any] = builtins.__import__
        self._watching: Callable[..., Any] | None = None

    def __enter__(self) -> Asked:
        original, names, heavy = self._original, self.names, frozenset(MODULES)

        def watching(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
            if level == 0 and (top := name.partition(".")[0]) in heavy:
                names.add(top)
            return original(name, globals, locals, fromlist, level)

        builtins.__import__ = self._watching = watching
        return self

    def __exit__(self, *_: object) -> None:
        if builtins.__import__ is self._watching:  # never undo what someone installed after
            builtins.__import__ = self._original

    def modules(self) -> list[str]:
        now = set(imported())
        return [name for name in MODULES if name in self.names or (name in now and name not in self._before)]


def apply_thread_count() -> None:
    """Thread-count variables take effect when a library starts, which happened before this process became a
    replica (in its zygote, or in its warm start): apply its own to torch again (the agent sets OMP_NUM_THREADS to the
    CPUs a replica is pinned to)."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
