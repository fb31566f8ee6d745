"""The scheduler's inputs on declared virtual inventories: nodes, snapshots, requests and reservations."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ember.wire import NodeInfo
from ember_platform.scheduler import Cluster, PlacementRequest, Reservation, Snapshot, build_snapshot, parse_gpu
from ember_runtime.agent.inventory import parse

H100X2 = '[[gpu]]\nmodel = "H100-80GB"\ncount = 2\n'
A10G = '[[gpu]]\nmodel = "A10G-24GB"\n'


def node(node_id: str, toml: str, *, cpu: int = 64, memory_gb: int = 512, bundles: tuple[str, ...] = ()) -> NodeInfo:
    """Node ``node_id`` with the devices of the inventory ``toml`` (its host named after the node)."""
    devices = parse(toml + f'\n[host]\nname = "{node_id}"\n')
    return NodeInfo(node_id=node_id, hostname=node_id, devices=devices, updated_at=0.0, cpu_cores=cpu,
                    memory_mb=memory_gb * 1024, bundles=list(bundles))


def snap(*nodes: NodeInfo, reservations: Iterable[Reservation] = ()) -> Snapshot:
    """The scheduler's view of ``nodes`` with ``reservations`` already held."""
    return build_snapshot(Cluster.from_nodes(nodes), reservations)


def req(replica_id: str, gpu: Any = None, *, function: str = "f", **fields: Any) -> PlacementRequest:
    """A request for replica ``replica_id`` of ``function``; ``gpu`` as the decorator takes it."""
    return PlacementRequest(replica_id=replica_id, function=function, gpu=parse_gpu(gpu), **fields)


def held(node_id: str, uuid: str, memory_mb: int, *, function: str = "other", priority: str = "interactive",
         replica_id: str | None = None) -> Reservation:
    """``memory_mb`` of GPU ``uuid`` on ``node_id`` held by a replica of ``function`` (one CPU, 1 GiB of host)."""
    return Reservation(replica_id=replica_id or f"{function}-{uuid}-{memory_mb}", function=function, node_id=node_id,
                       gpu_uuids=(uuid,), memory_mb=memory_mb, cpu_millis=1000, host_memory_mb=1024,
                       priority=priority)  # type: ignore[arg-type]
