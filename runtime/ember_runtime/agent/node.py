"""The node agent: reports the node's devices, runs the replicas of what is deployed, restarts crashes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
import uuid
from collections.abc import Collection, Coroutine
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.msg import Msg

from ember._loop import cancel_and_wait
from ember.wire import (
    LogLine,
    NodeAssignment,
    NodeInfo,
    ReplicaState,
    ReplicaStatus,
    SlotAssignment,
    VolumeMount,
    ZygoteAssignment,
    encoder,
    replica_decoder,
    subjects,
)
from ember.wire.jetstream import NODE_HEARTBEAT_S, connect
from ember.wire.natscreds import CREDS_ENV, NODE_USER_PREFIX, NatsCredentials, node_user, replica_credentials
from ember_runtime.agent import adoption, builder, devices, gpu_faults, numa
from ember_runtime.agent import inventory as inventory_source
from ember_runtime.agent import sandbox as sandboxes
from ember_runtime.agent import warm_starts as warm
from ember_runtime.agent.buckets import open_buckets
from ember_runtime.agent.bundles import BundleCache
from ember_runtime.agent.cgroups import MemoryCgroups
from ember_runtime.agent.drains import Drains
from ember_runtime.agent.fetch import AssignmentWatch, NodeFetcher
from ember_runtime.agent.gpu_usage import VIRTUAL_TABLE_ENV, DeclaredUsage, NvmlUsage, UsageSource
from ember_runtime.agent.images import NodeImages
from ember_runtime.agent.memory_watch import UsageWatcher
from ember_runtime.agent.secrets import SecretsFetcher, SecretsUnavailable
from ember_runtime.agent.slots import STOP_GRACE_S, ReplicaSlot, SlotKey
from ember_runtime.agent.volumes import VolumeCache, widen_nats_reads
from ember_runtime.agent.zygote_pool import ZygoteKey, ZygotePool, beside_another_app

log = logging.getLogger("ember.agent")
RECONCILE_EVERY_S = 2.0
VOLUME_CHECK_EVERY_S = 60.0  # cached volumes in use are checked (stat, then hashes if changed) this often
FETCH_BACKOFF_S = (2.0, 300.0)  # a bundle that could not be fetched or unpacked is tried again after 2, 4, ... 300 s


class NodeAgent:
    """Runs, on this node, the replicas the scheduler assigned to it, and reports the node's devices.

    With ``inventory`` (a declared virtual inventory file) the node reports those devices instead of
    NVML's, through the same code path; its replicas then still run on the CPU, and the GPU memory they
    use is what they declare to a virtual driver (see ``gpu_usage``) instead of what NVML measures.
    Each replica is pinned to the CPUs of its GPU's NUMA node (see ``numa``).
    """

    def __init__(self, nats_url: str, state_dir: Path, node_id: str | None = None,
                 inventory: Path | None = None, creds: NatsCredentials | None = None,
                 sandbox: sandboxes.Sandbox = sandboxes.NO_SANDBOX, stop_grace_s: float = STOP_GRACE_S,
                 warm_starts: int = warm.DEFAULT_LIMIT, build_memory_mb: int = builder.MEMORY_MB,
                 ignore_xids: frozenset[int] | None = gpu_faults.APPLICATION_XIDS) -> None:
        self.nats_url = nats_url
        self.stop_grace_s = stop_grace_s  # what each replica is given to drain when the agent stops
        self.creds = creds  # this node's NATS credentials; its replicas' are derived from them
        self.state_dir = state_dir
        self.node_id = node_id or (creds.user[len(NODE_USER_PREFIX):] if creds else None) or \
            f"{socket.gethostname().split('.')[0]}-{uuid.uuid4().hex[:6]}".replace("_", "-")
        if creds is not None and creds.user != node_user(self.node_id):
            raise ValueError(f"the NATS credentials are node {creds.user!r}'s, not node {self.node_id!r}'s")
        self.inventory = inventory
        self.devices = inventory_source.load(inventory)
        self.device_nodes = devices.REAL if inventory is None else devices.stand_ins(state_dir / "dev", self.devices)
        self.usage_watcher: UsageWatcher | None = None  # samples the GPU memory each replica uses
        self.gpu_faults = gpu_faults.GpuFaults(ignore_xids or ())  # GPUs out of service (a critical Xid error)
        self._watch_xids = ignore_xids is not gpu_faults.ALL
        self._beat = asyncio.Event()  # set: the node reports now (a GPU's fault), not at its next heartbeat
        self.host = inventory_source.load_host(inventory)
        self.numa = inventory_source.load_numa(inventory) or numa.read_topology()
        self.host_memory = numa.HostMemory(self.host.memory_mb)
        self.slots: dict[SlotKey, ReplicaSlot] = {}
        self.drains = Drains(self.host_memory)  # the slots being stopped, each draining in a task of its own
        self._starting: dict[SlotKey, asyncio.Task[None]] = {}  # replicas whose bundle is being fetched
        self._background: set[asyncio.Task[None]] = set()
        self._fetch_failures: dict[str, tuple[int, float, str]] = {}  # bundle -> (failures in a row, next try, why)
        self._slot_bundles: dict[SlotKey, str] = {}  # the bundle each running slot was started from
        self._zygote_bundles: set[str] = set()  # the bundles of the zygotes held
        self.sandbox = sandbox  # replicas and zygotes run in it (see ``sandbox``), when enabled
        self.cgroups: MemoryCgroups | None = None
        self.images = NodeImages(state_dir, sandbox, build_memory_mb=build_memory_mb)  # environments, push's builds
        self.zygotes = ZygotePool(state_dir, nats_url, on_event=self._zygote_event, sandbox_=sandbox,
                                  verify=lambda sha256: self.bundles.verify(sha256),
                                  mounts=self._zygote_mounts, devices=self._gpu_nodes, cgroups=lambda: self.cgroups)
        self._wake = asyncio.Event()
        self._volume_failures: dict[str, tuple[int, float, str]] = {}  # volumes -> (failures, next try, why)
        self._volumes_checked_at = 0.0
        self._slot_volumes: dict[SlotKey, list[VolumeMount]] = {}  # the volumes each running slot mounts
        self._zygote_volumes: list[VolumeMount] = []  # the volumes of the zygotes held
        self.adoptions = adoption.Adoptions(adoption.Records.of(state_dir), sandbox.network)
        self.warm = warm.WarmStarts(self.adoptions.records, warm_starts,  # fresh starts begun ahead (one per key)
                                    host_memory=self.host_memory)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then stop every replica (each drains) and disconnect."""
        widen_nats_reads()  # before it connects: volumes' chunks come in messages of megabytes
        while True:  # a connection the server closed at once (its auth refused late, say) is made again
            nc = await connect(self.nats_url, f"ember-agent-{self.node_id}", self.creds, wait_s=-1)
            stores = await open_buckets(nc, stop)
            if stores is not None or stop.is_set():
                break
            log.warning("NATS closed the agent's connection (%s); connecting again", nc.last_error)
        if stores is None:  # stopped before the control plane came
            await nc.close()
            return
        self._nc, self._stores = nc, stores
        self.adoptions.load()  # the replicas a killed agent left running, adopted by their slots as they start
        self._secrets = SecretsFetcher(nc, self.node_id)
        status_sub = await nc.subscribe(subjects.REPLICA_STATUS_ALL,
                                        cb=subjects.only_on(subjects.REPLICA_STATUS_ALL, self._on_replica_status))
        fetcher = NodeFetcher(nc, self.node_id)  # what is assigned to this node, through a control plane
        self.bundles = BundleCache(self.state_dir / "bundles", fetcher)
        self.volumes = VolumeCache(self.state_dir / "volumes", fetcher)
        self.cgroups = MemoryCgroups.for_agent()
        self.assignments = AssignmentWatch(nc, self.node_id, fetcher, on_change=self._wake.set)
        await self.assignments.start()
        await self.images.start(nc, self.node_id, self.bundles, cgroups=lambda: self.cgroups)
        heartbeat = asyncio.create_task(self._heartbeat(stop), name="node-heartbeat")
        usage = self._usage_source()
        self.usage_watcher = UsageWatcher(usage, self.slots.values) if usage is not None else None
        watch = asyncio.create_task(self.usage_watcher.run(stop), name="gpu-memory-watch") \
            if self.usage_watcher is not None else None
        xids = gpu_faults.source_for(self.devices, self.state_dir / "gpu-xids" if self.inventory else None) \
            if self._watch_xids else None
        faults = asyncio.create_task(gpu_faults.watch(xids, self.gpu_faults, stop, self._beat.set),
                                     name="gpu-fault-watch") if xids is not None else None
        log.info("node %s up with %s", self.node_id, ", ".join(d.name for d in self.devices))
        try:
            while not stop.is_set():
                self._wake.clear()  # before the pass: a change during it is not lost (it waited RECONCILE_EVERY_S)
                await self._reconcile()
                await self._collect_bundles()
                waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
                await asyncio.wait(waits, timeout=RECONCILE_EVERY_S, return_when=asyncio.FIRST_COMPLETED)
                for w in waits:
                    w.cancel()
        finally:
            starting = list(self._starting.values())
            for start in starting:
                start.cancel()
            await asyncio.gather(*starting, return_exceptions=True)
            await asyncio.gather(*(slot.stop(self.stop_grace_s) for slot in self.slots.values()),
                                 self.adoptions.stop_unwanted(set(), self.stop_grace_s), self.drains.wait(),
                                 return_exceptions=True)
            with contextlib.suppress(Exception):
                await status_sub.unsubscribe()
            self.slots.clear()
            await self.warm.stop()
            await self.zygotes.stop()
            await self.images.stop()
            await cancel_and_wait(heartbeat, watch, faults)  # the heartbeat's put may lose one cancellation
            for source in (usage, xids):
                if source is not None:
                    source.close()
            with contextlib.suppress(Exception):
                await stores.nodes.delete(self.node_id)
            await self.assignments.stop()
            await nc.drain()

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.inventory is None and any(d.kind == "gpu" for d in self.devices):  # NVML: busy, memory now
                self.devices = await asyncio.to_thread(inventory_source.sample_usage, self.devices)
            watcher = self.usage_watcher
            self._beat.clear()
            info = NodeInfo(node_id=self.node_id, hostname=socket.gethostname(),
                            devices=self.gpu_faults.apply(self.devices),
                            updated_at=time.time(), cpu_cores=self.host.cpu_cores, memory_mb=self.host.memory_mb,
                            bundles=self.bundles.cached(), host_memory_reserved_mb=self.host_memory.reserved_mb,
                            zygotes=self.zygotes.statuses(), volumes=self.volumes.cached(),
                            environments=self.images.cache.cached(), warm_starts=self.warm.statuses(),
                            replica_gpu_memory_mb=watcher.last_usage if watcher is not None else {},
                            gpu_forks=not self.sandbox.enabled, gpu_zygotes=True,  # see slots.unforkable
                            **sandboxes.isolation(self.sandbox, self.cgroups))
            try:
                await self._stores.nodes.put(self.node_id, encoder.encode(info))
            except Exception as exc:
                log.warning("node heartbeat failed: %s", exc)
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._beat.wait())]
            await asyncio.wait(waits, timeout=NODE_HEARTBEAT_S, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()

    @staticmethod
    def desired(assignment: NodeAssignment | None) -> dict[SlotKey, SlotAssignment]:
        if assignment is None:
            return {}
        return {SlotKey(s.app, s.service, s.version, s.index, s.replica_id): s for s in assignment.slots}

    async def _reconcile(self) -> None:
        # One assignment for the whole pass: the slots it starts are those of the zygotes it holds (a newer one that
        # came during the zygotes' awaits started its replicas cold, their zygote not yet asked for); a change during
        # the pass wakes the next at once.
        assignment = self.assignments.items.get(self.node_id)
        await self._reconcile_zygotes(assignment)
        want = self.desired(assignment)
        await self.warm.keep({k.app for k in want})
        if self.assignments.synced:
            await self.adoptions.stop_unwanted({k.replica_id for k in want}, self.stop_grace_s)
        for key in [k for k in self._starting if k not in want]:  # unassigned while its bundle was fetched
            self._starting.pop(key).cancel()
        for key in [k for k in self.slots if k not in want]:
            self.drains.stop(self.slots.pop(key))  # not waited for: a start waits only if it needs what it holds
        # Each start in a task of its own: a bundle being fetched for one replica holds up neither the others nor
        # the next reconcile (a replica assigned meanwhile starts, one unassigned meanwhile is stopped).
        for key, assigned in want.items():
            if key not in self.slots and key not in self._starting:
                task = asyncio.create_task(self._start(key, assigned), name=f"start-{key.replica_id}")
                self._starting[key] = task
                task.add_done_callback(partial(self._started, key))

    def _started(self, key: SlotKey, task: asyncio.Task[None]) -> None:
        if self._starting.get(key) is task:
            del self._starting[key]
        if not task.cancelled() and task.exception() is not None:
            log.error("starting %s failed", key.replica_id, exc_info=task.exception())

    async def _collect_bundles(self) -> None:
        """Keep the bundle cache within its budget (EMBER_NODE_BUNDLE_CACHE_BYTES), after a fetch and every
        minute; what a running replica, a zygote or this node's assignment uses stays."""
        assignment = self.assignments.items.get(self.node_id)
        live = {*self.slots, *self.drains.keys}  # a stopping replica runs from its bundle until it exited
        in_use = {self._slot_bundles[k] for k in live if k in self._slot_bundles} | self._zygote_bundles
        if assignment is not None:
            in_use |= {s.bundle_sha256 for s in assignment.slots} | {z.bundle_sha256 for z in assignment.zygotes}
        in_use |= {r.bundle_sha256 for r in self.adoptions.pending.values()}  # the agent before's, not taken yet
        self._slot_bundles = {k: v for k, v in self._slot_bundles.items() if k in live}
        try:
            await self.bundles.maybe_evict(in_use)
        except Exception:
            log.exception("the bundle cache could not be cut down to its budget")
        if not self.adoptions.pending:  # their environments and volumes are not recorded: none goes until they are
            await self.images.collect(assignment, live)
            await self._collect_volumes(assignment, live)

    async def _collect_volumes(self, assignment: NodeAssignment | None, live: set[SlotKey]) -> None:
        """Every minute: check the cached volumes that replicas use (a stat of each file; a change is hashed and
        repaired, see ``volumes``), and keep the cache within its budget, never removing one in use (``live``: the
        slots running or stopping)."""
        now = time.monotonic()
        if now - self._volumes_checked_at < VOLUME_CHECK_EVERY_S:
            return
        self._volumes_checked_at = now
        self._slot_volumes = {k: v for k, v in self._slot_volumes.items() if k in live}
        used = {m.key: m for ms in self._slot_volumes.values() for m in ms}
        used |= {m.key: m for m in self._zygote_volumes}
        if assignment is not None:
            used |= {m.key: m for s in assignment.slots for m in s.volumes}
        try:
            for mount in used.values():
                if self.volumes.has(mount):
                    await self.volumes.ensure(mount)
            await self.volumes.evict(set(used))
        except Exception:
            log.exception("the volume cache could not be checked or cut down to its budget")

    async def _mounts(self, volumes: list[VolumeMount]) -> tuple[tuple[Path, str], ...]:
        """Each volume fetched (once per node) and checked, as (cache folder, mount path)."""
        mounts = tuple([(await self.volumes.ensure(m), m.path) for m in volumes])
        problems = sandboxes.mount_problems(mounts, self.sandbox.python_roots)
        if problems:
            raise ValueError("; ".join(problems))
        return mounts

    async def _zygote_mounts(self, z: ZygoteAssignment) -> tuple[tuple[Path, str], ...]:
        return await self._mounts(z.volumes)

    def _zygote_event(self, app: str, service: str, line: str) -> None:
        """A zygote's failure, in its app's log stream (``ember logs``) as a line from the agent."""
        event = LogLine(replica_id=f"zygote@{self.node_id}", stream="agent", line=line, ts=time.time())
        self._in_background(self._nc.publish(subjects.logs(app, service, self.node_id), encoder.encode(event)))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _reconcile_zygotes(self, assignment: NodeAssignment | None) -> None:
        """Hold the zygotes the scheduler assigned to this node (their bundles unpacked and weights read
        ahead: the artifact cache), and only those."""
        wanted: dict[ZygoteKey, tuple[ZygoteAssignment, Path]] = {}
        zygotes, slots = (assignment.zygotes, assignment.slots) if assignment is not None else ([], [])
        interpreters, waiting = self.images.interpreters(zygotes)
        for z in zygotes:
            if (z.app, z.service, z.version) in waiting:  # its image's environment is being built first
                continue
            if beside_another_app(z, slots):
                continue
            try:
                bundle = await self.bundles.get(z.bundle_sha256)
            except Exception:
                log.exception("cannot fetch bundle %s of %s for its zygote", z.bundle_sha256[:12], z.app)
                continue
            wanted[(z.app, z.service, z.version)] = (z, bundle)
        await self.zygotes.reconcile(wanted, interpreters)
        self._zygote_bundles = {z.bundle_sha256 for z, _ in wanted.values()}
        self._zygote_volumes = [m for z, _ in wanted.values() for m in z.volumes]

    def _env(self, slot: SlotAssignment) -> dict[str, str]:
        """What the replica sees: only its devices; on a declared (virtual) inventory it runs on the CPU."""
        env = {"EMBER_DEVICE": "cpu"}
        if self.creds is not None:
            env[CREDS_ENV] = replica_credentials(self.creds, slot.replica_id).encode().decode()
        if slot.gpu_uuids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(slot.gpu_uuids)
            if slot.memory_mb:
                env["EMBER_GPU_MEMORY_MB"] = str(slot.memory_mb)
            if self.inventory is None:
                env["EMBER_DEVICE"] = "cuda:0"
        return env

    async def _on_replica_status(self, msg: Msg) -> None:
        """A replica of this node reports its state: written to ``ember_replicas`` under the identity the agent
        gave it (whatever the message says); an empty message: the replica is leaving. Others' are ignored."""
        replica_id = msg.subject.split(".")[2]
        slot = next((s for k, s in self.slots.items() if k.replica_id == replica_id), None) \
            or self.drains.get(replica_id)
        if slot is None:
            return
        with contextlib.suppress(Exception):
            if not msg.data:
                await self._stores.replicas.delete(subjects.replica_key(self.node_id, replica_id))
                return
            k = slot.key
            status = msgspec.structs.replace(replica_decoder.decode(msg.data), replica_id=replica_id,
                                             node_id=self.node_id, app=k.app, service=k.service, version=k.version)
            await self._stores.replicas.put(subjects.replica_key(self.node_id, replica_id), encoder.encode(status))
            if slot.warm_template and status.start and warm.asks(status.state, status.start, self.zygotes.forks(
                    k.app, k.service, k.version, slot.gpu_uuids if self.sandbox.enabled else None)):
                self.warm.want(slot.warm_template, status.start.modules)  # the next fresh start of its key takes one

    async def _start(self, key: SlotKey, slot: SlotAssignment) -> None:
        decided = time.time()
        kind = "artifact" if self.bundles.has(slot.bundle_sha256) else "cold"
        failures, next_try, reason = self._fetch_failures.get(slot.bundle_sha256, (0, 0.0, ""))
        if time.monotonic() < next_try:
            await self._report_unstarted(slot, reason)  # kept in view while it waits (the bucket forgets it)
            return
        try:
            bundle = await self.bundles.get(slot.bundle_sha256)
        except Exception as exc:
            await self._fetch_failed(slot, failures + 1, exc)
            return
        self._fetch_failures.pop(slot.bundle_sha256, None)
        try:
            secrets = await self._secrets.get(slot)
        except SecretsUnavailable as exc:
            if not exc.waiting:
                log.warning("%s (replica %s)", exc, slot.replica_id)
            await self._report_unstarted(slot, str(exc))
            return
        mounts = await self._slot_mounts(slot)
        if mounts is None:
            return
        image = None
        if slot.image is not None:  # its image's environment, built here once (another start may be building it)
            image = await self.images.prepare(slot, partial(self._report_unstarted, slot))
            if image is None:
                return
            if problems := sandboxes.mount_problems(mounts, image.readonly):  # a volume over its environment
                await self._report_unstarted(slot, "; ".join(problems))
                return
        pin = self._pinning(slot)
        env = {**(slot.image.env if slot.image else {}), **self._env(slot), **self._virtual_env(slot),
               **numa.thread_env(pin.cpus, os.environ), **sandboxes.volume_env(mounts, sandboxed=self.sandbox.enabled)}
        confinement = dataclasses.replace(self._confinement(slot, secrets), mounts=mounts)
        if image is not None:
            confinement = dataclasses.replace(confinement, readonly=image.readonly)
        adopted = await self.adoptions.take(key, slot.bundle_sha256, self.stop_grace_s)
        try:
            await self.drains.room_for(slot.replica_id, slot.gpu_uuids, slot.host_memory_mb)
        except BaseException:  # unassigned while it waited: an adopted process stops, not left serving unsupervised
            if isinstance(adopted, adoption.Adopted):
                self._in_background(self.adoptions.stop(adopted.record, self.stop_grace_s))
            raise
        replica = ReplicaSlot(key, nc=self._nc, replicas_kv=self._stores.replicas, nats_url=self.nats_url,
                              node_id=self.node_id, bundle=bundle, module=slot.module, env=env,
                              first_start=(kind, decided, time.time() - decided), gpu_uuids=slot.gpu_uuids,
                              gpu_memory_mb=slot.memory_mb, cpus=pin.cpus, zygotes=self.zygotes,
                              startup_timeout_s=slot.startup_timeout_s,
                              confinement=confinement, verify=partial(self.bundles.verify, slot.bundle_sha256),
                              python=image.python if image is not None else None, records=self.adoptions.records,
                              adopt=adopted, bundle_sha256=slot.bundle_sha256, warm=self.warm)
        self.slots[key] = replica
        self._slot_bundles[key] = slot.bundle_sha256
        self._slot_volumes[key] = list(slot.volumes)
        self.images.running[key] = slot.image
        log.log(logging.WARNING if pin.warn else logging.INFO, "starting %s (%s)", replica.replica_id, pin.why)
        self._count_host_memory(slot)
        replica.start()

    async def _slot_mounts(self, slot: SlotAssignment) -> tuple[tuple[Path, str], ...] | None:
        """The replica's volumes, fetched before it starts; None (said on its status, tried again later, backing
        off) when one cannot be fetched or mounted."""
        keys = ",".join(m.key for m in slot.volumes)
        failures, next_try, reason = self._volume_failures.get(keys, (0, 0.0, ""))
        if time.monotonic() < next_try:
            await self._report_unstarted(slot, reason)
            return None
        try:
            mounts = await self._mounts(slot.volumes)
        except Exception as exc:
            delay = min(FETCH_BACKOFF_S[0] * 2 ** failures, FETCH_BACKOFF_S[1])
            reason = (f"cannot fetch or mount volume(s) {keys} on node {self.node_id}: {type(exc).__name__}: {exc}; "
                      f"attempt {failures + 1}, next in {delay:.0f}s")
            self._volume_failures[keys] = (failures + 1, time.monotonic() + delay, reason)
            log.warning("%s (replica %s)", reason, slot.replica_id)
            await self._report_unstarted(slot, reason)
            return None
        self._volume_failures.pop(keys, None)
        return mounts

    def _confinement(self, slot: SlotAssignment, secrets: dict[str, str]) -> sandboxes.Confinement:
        """The replica's sandbox, with the device nodes of its GPUs (a declared inventory's stand-ins), its memory
        limit and its app's secrets (its environment only)."""
        return sandboxes.Confinement(sandbox=self.sandbox, devices=self._gpu_nodes(slot.gpu_uuids),
                                     memory_mb=slot.host_memory_mb,
                                     cgroups=self.cgroups, secrets=secrets, block_network=slot.block_network)

    def _gpu_nodes(self, uuids: Collection[str]) -> tuple[str, ...]:
        """The device nodes of these GPUs (a declared inventory's stand-ins) that a sandbox binds for them."""
        gpus = {d.index for d in self.devices if d.kind == "gpu" and d.uuid and d.uuid in uuids}
        return devices.gpu_devices(gpus, self.device_nodes)

    async def _fetch_failed(self, slot: SlotAssignment, failures: int, exc: Exception) -> None:
        """Try the bundle again later, backing off, and say why on the replica's status (``ember status`` and
        ``ember push`` show it), not only in this agent's log."""
        delay = min(FETCH_BACKOFF_S[0] * 2 ** (failures - 1), FETCH_BACKOFF_S[1])
        reason = (f"cannot fetch or unpack bundle {slot.bundle_sha256[:12]} on node {self.node_id}: "
                  f"{type(exc).__name__}: {exc}; attempt {failures}, next in {delay:.0f}s")
        self._fetch_failures[slot.bundle_sha256] = (failures, time.monotonic() + delay, reason)
        log.warning("%s (replica %s)", reason, slot.replica_id)
        await self._report_unstarted(slot, reason)

    async def _report_unstarted(self, slot: SlotAssignment, reason: str, state: ReplicaState = "crashed") -> None:
        now = time.time()
        status = ReplicaStatus(replica_id=slot.replica_id, node_id=self.node_id, app=slot.app, service=slot.service,
                               version=slot.version, state=state, pid=0, started_at=now, updated_at=now,
                               message=reason[:500])
        with contextlib.suppress(Exception):
            await self._stores.replicas.put(subjects.replica_key(self.node_id, slot.replica_id), encoder.encode(status))

    def _pinning(self, slot: SlotAssignment) -> numa.Pinning:
        """The CPUs of the NUMA node of the replica's GPUs, as the scheduler saw it or as this node reports it."""
        node = slot.numa_node
        if node < 0:
            nodes = {d.numa_node for d in self.devices if d.uuid and d.uuid in slot.gpu_uuids}
            node = nodes.pop() if len(nodes) == 1 else -1
        return numa.pinning(self.numa, node, numa.allowed_cpus())

    def _count_host_memory(self, slot: SlotAssignment) -> None:
        memory_mb = slot.host_memory_mb
        if not self.host_memory.reserve(slot.replica_id, memory_mb):
            log.warning("%s: over-committed by starting %s", self.host_memory.summary(), slot.replica_id)
        elif memory_mb:
            log.info("%s", self.host_memory.summary())

    def _usage_source(self) -> UsageSource | None:
        """Where the GPU memory watch reads usage: the virtual driver of a declared inventory, else NVML."""
        gpus = [d.uuid for d in self.devices if d.kind == "gpu" and d.uuid]
        if not gpus:
            return None
        if self.inventory is not None:
            return DeclaredUsage(self._virtual_table, gpus)
        try:
            return NvmlUsage()
        except Exception as exc:
            log.warning("GPU memory is not watched: NVML is unavailable: %s", exc)
            return None

    @property
    def _virtual_table(self) -> Path:
        return self.state_dir / "gpu-processes"

    def _virtual_env(self, slot: SlotAssignment) -> dict[str, str]:
        """On a declared inventory, where a replica declares the GPU memory it "uses" (see ``gpu_usage``)."""
        if self.inventory is None or not slot.gpu_uuids:
            return {}
        return {VIRTUAL_TABLE_ENV: str(self._virtual_table.resolve())}
