"""A zygote is its version's bundle's: an app deleted and pushed again numbers its versions from 1 again, so the node
may hold a zygote of "the same" version built from the deleted app's code. Its replicas must not fork from it: the
pool builds the new bundle's zygote instead, and a start that asks for the new bundle gets no other."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from ember.wire import ZygoteAssignment
from ember_runtime.agent.zygote_pool import ZygotePool

APP = '''
import ember

app = ember.App("{app}")


@app.model()
class Snap:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.code = "{code}"

    @ember.method
    def code(self) -> str:
        return self.code
'''
WAIT_S = 60.0  # not a speed bound: a zygote of a one-line setup is ready within seconds


def _bundle(root: Path, app: str, code: str) -> Path:
    bundle = root / code
    bundle.mkdir()
    (bundle / "reborn_snap.py").write_text(APP.format(app=app, code=code))
    return bundle


def test_a_zygote_of_another_bundle_of_the_same_version_is_replaced_and_never_handed_out(tmp_path: Path) -> None:
    app = f"zb-{uuid.uuid4().hex[:8]}"
    key = (app, "Snap", 1)
    old = ZygoteAssignment(app=app, service="Snap", version=1, bundle_sha256="a" * 64, module="reborn_snap")
    new = ZygoteAssignment(app=app, service="Snap", version=1, bundle_sha256="b" * 64, module="reborn_snap")
    pool = ZygotePool(tmp_path / "state", "nats://127.0.0.1:1")

    async def ready(sha: str) -> int:
        async def until() -> int:
            while not (z := await pool.get(*key, bundle_sha256=sha)):
                await asyncio.sleep(0.05)
            return z.status().pid

        return await asyncio.wait_for(until(), WAIT_S)

    async def scenario() -> None:
        try:
            await pool.reconcile({key: (old, _bundle(tmp_path, app, "deleted"))})
            first = await ready(old.bundle_sha256)
            assert await pool.get(*key, bundle_sha256=new.bundle_sha256) is None  # not the new code's
            await pool.reconcile({key: (new, _bundle(tmp_path, app, "pushed-again"))})
            assert await pool.get(*key, bundle_sha256=old.bundle_sha256) is None
            second = await ready(new.bundle_sha256)
            assert second != first
            assert [(s.version, s.state) for s in pool.statuses()] == [(1, "ready")]
        finally:
            await pool.stop()

    asyncio.run(scenario())


def test_a_zygote_starts_under_a_state_directory_deeper_than_a_sockets_path_allows(tmp_path: Path) -> None:
    app = f"zb-{uuid.uuid4().hex[:8]}-" + "a" * 40
    deep = tmp_path / ("d" * 60) / ("e" * 60)  # a socket's path is at most 107 bytes
    assignment = ZygoteAssignment(app=app, service="Snap", version=1, bundle_sha256="c" * 64, module="reborn_snap")
    pool = ZygotePool(deep, "nats://127.0.0.1:1")

    async def scenario() -> None:
        try:
            await pool.reconcile({(app, "Snap", 1): (assignment, _bundle(tmp_path, app, "deep"))})
            while not await pool.get(app, "Snap", 1):
                await asyncio.sleep(0.05)
                assert pool.statuses()[0].state != "failed", pool.statuses()[0].message
        finally:
            await pool.stop()

    asyncio.run(asyncio.wait_for(scenario(), WAIT_S))
