"""A zygote told to hold GPUs (``ZygoteAssignment.gpus``, on a node whose sandboxes bind their GPUs' device nodes)
is built with those GPUs' device nodes, hands its replicas only to starts given exactly those GPUs, and is built
again when the preloader moves it to others (its next replica's). tests/integration/test_enforcement.py checks the
device nodes a replica forked from it sees, on a declared inventory's virtual GPUs."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ember.wire import SlotAssignment, ZygoteAssignment
from ember_runtime.agent.zygote_pool import ZygotePool, beside_another_app

APP = '''
import ember

app = ember.App("{app}")


@app.model(gpu=1)
class Snap:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.loaded = True

    @ember.method
    def loaded(self) -> bool:
        return self.loaded
'''
WAIT_S = 60.0  # not a speed bound: a zygote of a one-line setup is ready within seconds


def test_a_zygote_holds_its_gpus_hands_out_to_their_replicas_alone_and_moves_with_them(tmp_path: Path) -> None:
    app = f"zg-{uuid.uuid4().hex[:8]}"
    key = (app, "Snap", 1)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "gpu_snap.py").write_text(APP.format(app=app))
    asked: list[list[str]] = []

    def device_nodes(gpus: Sequence[str]) -> tuple[str, ...]:
        asked.append(list(gpus))
        return tuple(f"/dev/nvidia{gpu[-1]}" for gpu in gpus)

    pool = ZygotePool(tmp_path / "state", "nats://127.0.0.1:1", devices=device_nodes)

    def on(*gpus: str) -> ZygoteAssignment:
        return ZygoteAssignment(app=app, service="Snap", version=1, bundle_sha256="a" * 64, module="gpu_snap",
                                gpus=list(gpus))

    async def ready(*gpus: str) -> int:
        while not (z := await pool.get(*key, gpus=gpus)):
            await asyncio.sleep(0.05)
            assert pool.statuses()[0].state != "failed", pool.statuses()[0].message
        return z.status().pid

    async def scenario() -> None:
        try:
            await pool.reconcile({key: (on("GPU-0"), bundle)})
            assert pool.gpus_of(*key) == ["GPU-0"] and asked == [["GPU-0"]]
            # while it builds, a start on its GPU will fork (and asks for no warm start); one on another will not
            assert pool.forks(*key, ["GPU-0"]) and not pool.forks(*key, ["GPU-1"]) and pool.forks(*key)
            first = await ready("GPU-0")
            assert await pool.get(*key, gpus=["GPU-1"]) is None  # a replica on another GPU starts fresh
            assert await pool.get(*key, gpus=["GPU-0", "GPU-1"]) is None  # nor one of more GPUs
            assert await pool.get(*key) is not None  # a start on a node without sandboxes asks for no GPUs
            await pool.reconcile({key: (on("GPU-0"), bundle)})  # told the same again: kept
            assert await pool.get(*key, gpus=["GPU-0"]) is not None and asked == [["GPU-0"]]
            await pool.reconcile({key: (on("GPU-1"), bundle)})  # its next replica goes on GPU-1: built there
            assert await pool.get(*key, gpus=["GPU-0"]) is None
            second = await ready("GPU-1")
            assert second != first and asked == [["GPU-0"], ["GPU-1"]]
            assert [(s.version, s.state, s.gpus) for s in pool.statuses()] == [(1, "ready", ["GPU-1"])]
        finally:
            await pool.stop()

    asyncio.run(asyncio.wait_for(scenario(), WAIT_S))


def test_a_node_builds_no_zygote_on_a_gpu_another_apps_replica_is_given() -> None:
    zygote = ZygoteAssignment(app="a", service="S", version=1, bundle_sha256="a" * 64, module="m", gpus=["GPU-0"])

    def on(app: str, *gpus: str) -> SlotAssignment:
        return SlotAssignment(replica_id=f"{app}-{len(gpus)}", app=app, service="S", version=1, index=0,
                              gpu_uuids=list(gpus))

    assert beside_another_app(zygote, [on("b", "GPU-0")])  # another tenant's replica on its GPU
    assert beside_another_app(zygote, [on("a", "GPU-0"), on("b", "GPU-1", "GPU-0")])
    assert not beside_another_app(zygote, [on("a", "GPU-0"), on("b", "GPU-1"), on("c")])  # its own app's: fine
    assert not beside_another_app(msgspec.structs.replace(zygote, gpus=[]), [on("b", "GPU-0")])  # holds none
