"""The node agent's images: the environments its replicas and zygotes run in, and the builds a control plane
asks of it at push time (see ``builder``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from ember.wire import NodeAssignment, ReplicaState, SlotAssignment, ZygoteAssignment
from ember.wire.images import ImageSpec
from ember_runtime.agent import builder as builds
from ember_runtime.agent import sandbox as sandboxes
from ember_runtime.agent.builder import Builder
from ember_runtime.agent.cgroups import MemoryCgroups
from ember_runtime.agent.envs import BuildError, Env, EnvCache
from ember_runtime.agent.zygote_pool import Interpreter, ZygoteKey

log = logging.getLogger("ember.agent")
RETRY_S = (5.0, 300.0)  # an environment that failed to build is tried again after 5, 10, ... 300 s
Report = Callable[[str, ReplicaState], Awaitable[None]]
COLLECT_EVERY_S = 60.0


class NodeImages:
    """The environment cache of this node, the environments being prepared for its zygotes, and the builder."""

    def __init__(self, state_dir: Path, sandbox: sandboxes.Sandbox = sandboxes.NO_SANDBOX, *,
                 build_memory_mb: int = builds.MEMORY_MB) -> None:
        self.cache = EnvCache(state_dir / "envs")
        self.sandbox = sandbox
        self.build_memory_mb = build_memory_mb  # what a build's import may use
        self._failures: dict[str, tuple[int, float, str]] = {}  # sha -> (failures in a row, next try, why)
        self._preparing: dict[str, asyncio.Task[Env | None]] = {}
        self._builder: Builder | None = None
        self.running: dict[Any, ImageSpec | None] = {}  # slot key -> the image a running replica was started with
        self._collected_at = 0.0
        self._builds_seen = 0

    async def start(self, nc: Any, node_id: str, bundles: Any,
                    cgroups: Callable[[], MemoryCgroups | None] = lambda: None) -> None:
        self._builder = Builder(nc, node_id, self.cache, bundles, self.sandbox, memory_mb=self.build_memory_mb,
                                cgroups=cgroups)
        await self._builder.start()

    async def stop(self) -> None:
        if self._builder is not None:
            await self._builder.stop()
        tasks = list(self._preparing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def prepare(self, slot: SlotAssignment, report: Report) -> Env | None:
        """The environment of a replica's image, built here first if needed; None after a failure (said on the
        replica's status, tried again later with backoff)."""
        image = slot.image
        assert image is not None
        failures, next_try, why = self._failures.get(image.sha256, (0, 0.0, ""))
        if time.monotonic() < next_try:
            await report(why, "crashed")
            return None
        if not self.cache.cached().count(image.sha256):
            await report(f"building environment {image.sha256[:12]} on this node", "starting")
        try:
            env = await self.cache.ensure(image)
        except (BuildError, OSError) as exc:
            delay = min(RETRY_S[0] * 2 ** failures, RETRY_S[1])
            reason = (f"cannot build environment {image.sha256[:12]}: {exc}; attempt {failures + 1}, "
                      f"next in {delay:.0f}s")
            self._failures[image.sha256] = (failures + 1, time.monotonic() + delay, reason[:480])
            log.warning("%s (replica %s)", reason, slot.replica_id)
            await report(reason, "crashed")
            return None
        self._failures.pop(image.sha256, None)
        return env

    def interpreters(self, zygotes: Iterable[ZygoteAssignment]) -> tuple[dict[ZygoteKey, Interpreter], set[ZygoteKey]]:
        """For the zygotes with an image: the interpreter of those whose environment is ready, and the keys of
        those still waiting for theirs (being built in the background; the pool holds them once it is)."""
        ready: dict[ZygoteKey, Interpreter] = {}
        waiting: set[ZygoteKey] = set()
        for z in zygotes:
            if z.image is None:
                continue
            key = (z.app, z.service, z.version)
            env = self._ready(z.image)
            if env is None:
                waiting.add(key)
                self._prepare_later(z.image)
            else:
                ready[key] = interpreter(env, z.image)
        return ready, waiting

    def _ready(self, image: ImageSpec) -> Env | None:
        task = self._preparing.get(image.sha256)
        if task is not None and task.done() and not task.cancelled() and task.exception() is None:
            return task.result()
        return None

    def _prepare_later(self, image: ImageSpec) -> None:
        if image.sha256 in self._preparing and not self._preparing[image.sha256].done():
            return
        failures, next_try, _ = self._failures.get(image.sha256, (0, 0.0, ""))
        if image.sha256 in self._preparing and time.monotonic() < next_try:
            return

        async def build() -> Env | None:
            try:
                return await self.cache.ensure(image)
            except (BuildError, OSError) as exc:
                delay = min(RETRY_S[0] * 2 ** failures, RETRY_S[1])
                self._failures[image.sha256] = (failures + 1, time.monotonic() + delay, str(exc)[:480])
                log.warning("environment %s for a zygote: %s", image.sha256[:12], exc)
                raise

        self._preparing[image.sha256] = asyncio.get_running_loop().create_task(build(), name="zygote-env")

    async def collect(self, assignment: NodeAssignment | None, slots: Iterable[Any]) -> None:
        """Keep the environment cache within its budget, after a build and every minute: never an environment of a
        running replica, or of a replica or zygote assigned here."""
        live = set(slots)
        self.running = {k: v for k, v in self.running.items() if k in live}
        if time.monotonic() - self._collected_at < COLLECT_EVERY_S and self.cache.builds == self._builds_seen:
            return
        self._collected_at, self._builds_seen = time.monotonic(), self.cache.builds
        in_use = {image.sha256 for image in self.running.values() if image is not None}
        if assignment is not None:
            in_use |= {s.image.sha256 for s in assignment.slots if s.image is not None}
            in_use |= {z.image.sha256 for z in assignment.zygotes if z.image is not None}
        for sha in [s for s, t in self._preparing.items() if t.done() and s not in in_use]:
            task = self._preparing.pop(sha)
            with contextlib.suppress(BaseException):
                task.exception()
        try:
            await asyncio.to_thread(self.cache.collect, in_use)
            await self.cache.collect_uv_cache()
        except (BuildError, OSError):
            log.exception("the environment cache could not be cut down to its budget")


def interpreter(env: Env, image: ImageSpec) -> Interpreter:
    return Interpreter(python=str(env.python), readonly=env.readonly, env=dict(image.env))
