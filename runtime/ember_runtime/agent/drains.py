"""Replicas the node agent is stopping: each drains its calls in a task of its own.

A reconcile pass does not wait for them: the replicas it starts meanwhile (another function's scale-up, a new
version) start at once. A start waits only for the stopping replicas that hold what it needs, which the scheduler
already counts as free: one of its own id (assigned again while it drains), those on one of its GPUs (their memory
is not given back before they exit), and every one of them while its host memory would not fit beside them. Until
a stopping replica has exited, what it runs from (its bundle, volumes and image environment) counts as in use, and
its reports are still relayed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

from ember_runtime.agent.numa import HostMemory
from ember_runtime.agent.slots import ReplicaSlot, SlotKey

log = logging.getLogger("ember.agent")


class Drains:
    def __init__(self, host_memory: HostMemory) -> None:
        self._host_memory = host_memory
        self._slots: dict[str, ReplicaSlot] = {}  # replica id -> the slot being stopped
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def stop(self, slot: ReplicaSlot) -> None:
        """Stop ``slot`` (no longer assigned here) in a task of its own; its host memory is released once it
        exited."""
        log.info("stopping %s", slot.replica_id)
        self._slots[slot.replica_id] = slot
        self._tasks[slot.replica_id] = asyncio.create_task(self._stop(slot), name=f"stop-{slot.replica_id}")

    async def _stop(self, slot: ReplicaSlot) -> None:
        try:
            await slot.stop()
        finally:
            self._host_memory.release(slot.replica_id)
            self._slots.pop(slot.replica_id, None)
            self._tasks.pop(slot.replica_id, None)

    def get(self, replica_id: str) -> ReplicaSlot | None:
        return self._slots.get(replica_id)

    @property
    def keys(self) -> set[SlotKey]:
        """The slots being stopped: what they run from is in use until they exit."""
        return {slot.key for slot in self._slots.values()}

    async def room_for(self, replica_id: str, gpu_uuids: Collection[str], host_memory_mb: int) -> None:
        """Until the stopping replicas that hold what a new one needs have exited: one of the same id (assigned again
        while it drains: one id, one process), those on any of ``gpu_uuids``, and all of them while
        ``host_memory_mb`` more would over-commit the node's RAM."""
        memory = self._host_memory
        crowded = bool(memory.total_mb) and memory.reserved_mb + max(host_memory_mb, 0) > memory.total_mb
        gpus = set(gpu_uuids)
        waits = [task for stopping, task in list(self._tasks.items())
                 if crowded or stopping == replica_id or gpus & set(self._slots[stopping].gpu_uuids)]
        await asyncio.gather(*waits, return_exceptions=True)

    async def wait(self) -> None:
        """Until every replica being stopped has exited."""
        await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)
