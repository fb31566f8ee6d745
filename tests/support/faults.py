"""Faults the tests inject into a node agent, from outside the product.

The agent has no switch for them: a production build neither contains nor honours this module. A test platform
asked for faults starts its agents through :func:`main` instead of ``python -m ember_runtime``; ``main`` wraps the
agent's own functions in that process, then runs the agent as ``python -m ember_runtime`` would. (Faults inside a
replica come from the app a test pushes: its own code is what the replica runs.)
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import runpy
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("ember.agent")
_starting_app: contextvars.ContextVar[str] = contextvars.ContextVar("starting_app", default="")


@dataclass(frozen=True)
class AgentFaults:
    """What to do wrong in a node agent. ``hold_fetch``: app -> seconds its bundle's fetch waits before it begins
    (to prove that a slow fetch holds up no other replica). ``failed_starts``: app -> how many starts of its
    replicas fail before a process runs (as a sandbox that cannot be set up does)."""

    hold_fetch: dict[str, float] = field(default_factory=dict)
    failed_starts: dict[str, int] = field(default_factory=dict)

    def command(self, cmd: list[str]) -> list[str]:
        """``cmd`` (``python -m ember_runtime ...``) started through :func:`main` with these faults."""
        tests = str(Path(__file__).resolve().parent.parent)
        bootstrap = f"import sys; sys.path.insert(0, {tests!r}); from support.faults import main; main()"
        return [sys.executable, "-c", bootstrap, json.dumps(asdict(self)), *cmd[3:]]


def install(faults: AgentFaults) -> None:
    """Wrap the agent's functions in this process as ``faults`` asks."""
    from ember_runtime.agent.bundles import BundleCache
    from ember_runtime.agent.node import NodeAgent
    from ember_runtime.agent.slots import ReplicaSlot

    if faults.failed_starts:
        spawn, left = ReplicaSlot._spawn, dict(faults.failed_starts)

        async def failing_spawn(self: ReplicaSlot, *args: Any) -> Any:
            if left.get(self.key.app, 0) > 0:
                left[self.key.app] -= 1
                log.warning("fault: failing a start of %s", self.replica_id)
                raise OSError(f"fault: a start of {self.key.app}'s replica failed")
            return await spawn(self, *args)

        ReplicaSlot._spawn = failing_spawn  # type: ignore[method-assign]
    if not faults.hold_fetch:
        return
    start, get = NodeAgent._start, BundleCache.get

    async def start_knowing_the_app(self: NodeAgent, key: Any, slot: Any) -> None:
        token = _starting_app.set(slot.app)  # each start runs in a task of its own: the app is its fetch's
        try:
            await start(self, key, slot)
        finally:
            _starting_app.reset(token)

    async def held_get(self: BundleCache, sha256: str) -> Path:
        app = _starting_app.get()
        if app in faults.hold_fetch:
            log.warning("fault: holding the fetch of %s's bundle for %s s", app, faults.hold_fetch[app])
            await asyncio.sleep(faults.hold_fetch[app])
        return await get(self, sha256)

    NodeAgent._start = start_knowing_the_app  # type: ignore[method-assign]
    BundleCache.get = held_get  # type: ignore[method-assign]


def main() -> None:
    """``<python> -c <bootstrap> FAULTS-JSON AGENT-ARGS...``: the node agent, with these faults."""
    faults = AgentFaults(**json.loads(sys.argv[1]))
    sys.argv = ["ember_runtime", *sys.argv[2:]]
    install(faults)
    runpy.run_module("ember_runtime", run_name="__main__", alter_sys=True)

