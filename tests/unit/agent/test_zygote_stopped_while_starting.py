"""A zygote the scheduler takes away while its process is still being started is stopped, and its removal returns.

Before, ``Zygote.stop`` found no process yet, sent no signal, then waited for the build task, which went on to start
the zygote and then waited for it to exit, which nothing asked it to: the agent's reconcile loop (which removes
zygotes) waited forever, so that node started and stopped nothing more. A network of its own per sandbox (pasta
attached during the start) made that window wide enough to hit on a loaded two-node platform."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from support.procs import running

from ember.wire import ZygoteAssignment
from ember_runtime.agent import sandbox
from ember_runtime.agent.sandbox import Sandbox
from ember_runtime.agent.zygote_pool import ZygotePool

APP = '''
import ember

app = ember.App("{app}")


@app.model()
class Snap:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.loaded = True

    @ember.method
    def ping(self) -> bool:
        return self.loaded
'''
HANG_GUARD_S = 60.0  # not a speed bound: the removal either returns or never does


def _zygotes_of(app: str) -> list[int]:
    """Running zygote processes (not zombies) of ``app``."""
    return running(lambda argv: any(b"ember_runtime.zygote" in arg for arg in argv) and app.encode() in argv)


def _bundle(tmp_path: Path, app: str) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "probe_stop.py").write_text(APP.format(app=app))
    return bundle


def _remove_while_starting(pool: ZygotePool, app: str, bundle: Path, starting: Callable[[], bool],
                           go_on: Callable[[], None]) -> None:
    """Ask ``pool`` for the zygote, take it away once ``starting()`` says its start is under way, then let the
    start go on (``go_on``): the removal must return, the zygote gone."""
    assignment = ZygoteAssignment(app=app, service="Snap", version=1, bundle_sha256="0" * 64,
                                  module="probe_stop")

    async def scenario() -> None:
        await pool.reconcile({(assignment.app, assignment.service, assignment.version): (assignment, bundle)})
        await asyncio.wait_for(wait_until(starting), HANG_GUARD_S)
        removing = asyncio.create_task(pool.reconcile({}))  # the scheduler took it away meanwhile
        await asyncio.wait_for(wait_until(lambda: pool.statuses() == []), HANG_GUARD_S)
        go_on()  # the start it was in the middle of finishes
        await asyncio.wait_for(removing, HANG_GUARD_S)
        await pool.stop()

    asyncio.run(scenario())


async def wait_until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_a_zygote_removed_while_its_bundle_is_checked_is_stopped(tmp_path: Path) -> None:
    app = f"zs-{uuid.uuid4().hex[:8]}"
    bundle = _bundle(tmp_path, app)
    gate = asyncio.Event()
    asked: list[str] = []

    async def verify(sha: str) -> Path:  # the start is under way
        asked.append(sha)
        await gate.wait()
        return bundle

    pool = ZygotePool(tmp_path / "s", "nats://127.0.0.1:1", verify=verify)
    _remove_while_starting(pool, app, bundle, lambda: bool(asked), gate.set)
    assert _zygotes_of(app) == []  # nothing of it runs on


def test_a_zygote_removed_while_its_sandbox_starts_is_stopped(node_sandbox: Sandbox, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    app = f"zs-{uuid.uuid4().hex[:8]}"
    bundle = _bundle(tmp_path, app)
    reading, gate = threading.Event(), threading.Event()
    read_all = sandbox._read_all

    def held_read(fd: int) -> bytes:  # bwrap is running; its start (pasta attaching, on a node) not yet done
        reading.set()
        gate.wait(HANG_GUARD_S)
        return read_all(fd)

    monkeypatch.setattr(sandbox, "_read_all", held_read)
    pool = ZygotePool(tmp_path / "s", "nats://127.0.0.1:1", sandbox_=node_sandbox)
    _remove_while_starting(pool, app, bundle, reading.is_set, gate.set)
    assert _zygotes_of(app) == []  # its sandbox was killed with the start
