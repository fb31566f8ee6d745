"""What placement decides for each replica: a binding (maybe displacing batch work), or why not."""

from __future__ import annotations

import msgspec

from ember_platform.scheduler.request import Priority
from ember_platform.scheduler.snapshot import Reservation


class Binding(msgspec.Struct, frozen=True, kw_only=True):
    """Run ``replica_id`` on ``node_id`` with these GPUs, after stopping the replicas in ``preempts``.

    ``gpu_uuids`` are what the replica may see (``CUDA_VISIBLE_DEVICES``; a MIG slice only by its
    uuid); ``numa_node`` is where to pin its CPU threads (-1: unknown or split).
    """

    replica_id: str
    function: str
    node_id: str
    gpu_uuids: tuple[str, ...] = ()
    gpu_indices: tuple[int, ...] = ()
    memory_mb: int = 0  # per GPU; 0: each GPU whole
    cpu_millis: int = 0
    host_memory_mb: int = 0
    priority: Priority = "interactive"
    numa_node: int = -1
    preempts: tuple[str, ...] = ()

    def reservation(self) -> Reservation:
        return Reservation(replica_id=self.replica_id, function=self.function, node_id=self.node_id,
                           gpu_uuids=self.gpu_uuids, memory_mb=self.memory_mb, cpu_millis=self.cpu_millis,
                           host_memory_mb=self.host_memory_mb, priority=self.priority)


class Unschedulable(msgspec.Struct, frozen=True, kw_only=True):
    """No node can take ``replica_id`` now; ``reason`` says what it needs."""

    replica_id: str
    function: str
    reason: str


Decision = Binding | Unschedulable
