"""The node agent: reports the node's devices, runs the replicas of what is deployed, restarts crashes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from ember._nats import KVMirror, connect, ensure_buckets
from ember._wire import Deployment, NodeInfo, ReplicaStatus, deployment_decoder, encoder, replica_decoder
from ember_runtime._bundles import BundleCache
from ember_runtime._devices import discover
from ember_runtime._slot import ReplicaSlot, SlotKey

log = logging.getLogger("ember.agent")
NODE_HEARTBEAT_S = 3.0
RECONCILE_EVERY_S = 2.0


class NodeAgent:
    """Reconciles the replicas running on this node with the deployments in KV.

    Until the scheduler assigns replicas to nodes, every agent runs ``max(min_replicas, 1)`` replicas of
    each deployed service. On a new version, the old version's replicas stop once the new ones are ready.
    """

    def __init__(self, nats_url: str, state_dir: Path, node_id: str | None = None) -> None:
        self.nats_url = nats_url
        self.state_dir = state_dir
        self.node_id = node_id or f"{socket.gethostname().split('.')[0]}-{uuid.uuid4().hex[:6]}".replace("_", "-")
        self.slots: dict[SlotKey, ReplicaSlot] = {}
        self._wake = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then stop every replica (each drains) and disconnect."""
        nc = await connect(self.nats_url, f"ember-agent-{self.node_id}")
        stores = await ensure_buckets(nc.jetstream())
        self._nc, self._stores = nc, stores
        self.bundles = BundleCache(self.state_dir / "bundles", stores["bundles"])
        self.deployments: KVMirror[Deployment] = KVMirror(stores["deployments"], deployment_decoder.decode,
                                                          on_change=lambda *_: self._wake.set())
        self.replicas: KVMirror[ReplicaStatus] = KVMirror(stores["replicas"], replica_decoder.decode,
                                                          on_change=lambda *_: self._wake.set())
        await self.deployments.start()
        await self.replicas.start()
        heartbeat = asyncio.create_task(self._heartbeat(stop), name="node-heartbeat")
        log.info("node %s up with %s", self.node_id, ", ".join(d.name for d in self.devices))
        try:
            while not stop.is_set():
                await self._reconcile()
                self._wake.clear()
                waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
                await asyncio.wait(waits, timeout=RECONCILE_EVERY_S, return_when=asyncio.FIRST_COMPLETED)
                for w in waits:
                    w.cancel()
        finally:
            await asyncio.gather(*(slot.stop() for slot in self.slots.values()), return_exceptions=True)
            self.slots.clear()
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
            with contextlib.suppress(Exception):
                await stores["nodes"].delete(self.node_id)
            await self.deployments.stop()
            await self.replicas.stop()
            await nc.drain()

    @property
    def devices(self) -> list[Any]:
        if not hasattr(self, "_devices"):
            self._devices = discover()
        return self._devices

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            info = NodeInfo(node_id=self.node_id, hostname=socket.gethostname(), devices=self.devices,
                            updated_at=time.time())
            try:
                await self._stores["nodes"].put(self.node_id, encoder.encode(info))
            except Exception as exc:
                log.warning("node heartbeat failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), NODE_HEARTBEAT_S)

    def desired(self) -> dict[SlotKey, Deployment]:
        want = {}
        for dep in self.deployments.items.values():
            for svc in dep.manifest.services:
                for i in range(max(svc.min_replicas, 1)):
                    want[SlotKey(dep.app, svc.name, dep.version, i)] = dep
        return want

    async def _reconcile(self) -> None:
        want = self.desired()
        for key, dep in want.items():
            if key not in self.slots:
                await self._start(key, dep)
        for key in [k for k in self.slots if k not in want and not self._keep_for_rollout(k)]:
            slot = self.slots.pop(key)
            log.info("stopping %s", slot.replica_id)
            await slot.stop()

    def _keep_for_rollout(self, key: SlotKey) -> bool:
        """Keep an old version serving until the current version of its service has a ready replica."""
        dep = self.deployments.items.get(key.app)
        if dep is None or dep.version < key.version:
            return False
        return not any(r.state == "ready" and r.app == key.app and r.service == key.service
                       and r.version == dep.version for r in self.replicas.items.values())

    async def _start(self, key: SlotKey, dep: Deployment) -> None:
        try:
            bundle = await self.bundles.get(dep.bundle_sha256)
        except Exception:
            log.exception("cannot fetch bundle %s of %s", dep.bundle_sha256[:12], dep.app)
            return
        slot = ReplicaSlot(key, nc=self._nc, replicas_kv=self._stores["replicas"], nats_url=self.nats_url,
                           node_id=self.node_id, bundle=bundle, module=dep.manifest.module)
        self.slots[key] = slot
        log.info("starting %s", slot.replica_id)
        slot.start()
