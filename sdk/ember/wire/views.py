"""What the HTTP API shows of apps (``GET /v1/apps/<app>``) and of the cluster (``GET /v1/status``)."""

from __future__ import annotations

from typing import Literal

import msgspec

from ember.wire.nodes import ReplicaStatus, StartPhases, ZygoteStatus
from ember.wire.specs import TrafficShare


class ServiceView(msgspec.Struct, frozen=True, kw_only=True):
    """One service of an app as ``GET /v1/apps/<app>`` shows it."""

    name: str
    min_replicas: int
    max_replicas: int
    functions: list[str]
    replicas: list[ReplicaStatus]


class VersionView(msgspec.Struct, frozen=True, kw_only=True):
    """One kept version of an app: its share of unpinned calls now, and what it is doing.

    ``state``: ``serving`` (takes calls), ``canary`` (takes its share as a canary), ``rolling-out`` (its
    replicas start; it takes calls once its minimum replicas are ready), ``draining`` (no longer takes calls;
    its replicas finish what they hold and stop), ``kept`` (no replicas; ``ember rollback --to`` can bring it
    back)."""

    version: int
    percent: int
    state: Literal["serving", "canary", "rolling-out", "draining", "kept"]
    bundle_sha256: str
    created_at: float
    ready: int = 0  # its ready replicas, all services together
    warm: bool = False  # left the traffic lately: its replicas stay, taking no calls, so that a rollback is at once


class AppView(msgspec.Struct, frozen=True, kw_only=True):
    app: str
    version: int  # the version being rolled out or serving (the newest one asked for)
    bundle_sha256: str
    created_at: float
    services: list[ServiceView]
    versions: list[VersionView] = []  # every kept version, newest first
    switched_at: float = 0.0  # when the split of unpinned calls between versions last changed (epoch seconds)


class DeviceView(msgspec.Struct, frozen=True, kw_only=True):
    """One device of a node, with what the replicas assigned to it reserve."""

    kind: Literal["cpu", "gpu"]
    index: int
    name: str
    uuid: str = ""
    memory_total_mb: int = 0
    memory_free_mb: int | None = None  # None: not reported
    memory_reserved_mb: int = 0  # held by assigned replicas (a whole GPU for an exclusive one)
    utilization: float = 0.0
    mig_profile: str = ""  # a MIG slice; its GPU has ``mig_enabled``
    mig_enabled: bool = False
    replicas: list[str] = []  # ids of the replicas assigned to this device
    xid: int = 0  # the last Xid error its driver reported; 0: none since its node agent started
    fault: str = ""  # why it is out of service: nothing is placed on it, and its replicas move to other GPUs


class NodeReplicaView(msgspec.Struct, frozen=True, kw_only=True):
    """A replica on a node: assigned by the scheduler, reported by the replica, or both."""

    replica_id: str
    app: str
    service: str
    version: int
    state: str  # a ReplicaState, or "assigned" while the replica has not reported yet
    gpu_uuids: list[str] = []  # empty: CPU only, or no longer assigned (stopping)
    start: StartPhases | None = None  # how its (last) start went, once it reported one


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    """One live node, its devices and its replicas."""

    node_id: str
    hostname: str
    updated_at: float
    devices: list[DeviceView]
    replicas: list[NodeReplicaView] = []
    zygotes: list[ZygoteStatus] = []
    warm_starts: dict[str, str] = {}  # NodeInfo.warm_starts: app -> "starting" or "ready"
    sandbox: str = ""  # NodeInfo.sandbox
    isolation_notes: list[str] = []  # NodeInfo.isolation_notes


class ServiceStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One service's replicas against its bounds and what the autoscaler wants."""

    app: str
    service: str
    version: int
    functions: list[str]
    min_replicas: int  # effective: an ``ember scale`` override, else the decorator's
    max_replicas: int
    scaled: bool = False  # the bounds come from ``ember scale``
    desired: int = 0  # the control loop's last decision
    ready: int = 0  # replicas of the current version
    starting: int = 0
    crashed: int = 0  # crashed or failed
    queue_depth: int = 0  # calls waiting in the replicas' batchers
    pending: int = 0  # calls waiting in the functions' durable queues
    unschedulable: str = ""  # why the last placement failed; empty when it did not
    failure: str = ""  # why the control loop could not reconcile the service (it is skipped); empty when it could
    quota: str = ""  # why a quota holds it below what it wants (a placement refusal); empty when none does
    traffic: list[TrafficShare] = []  # the app's versions that take its calls now, and their shares
    replaced: str = ""  # when and why a replica last gave way and was replaced, within the hour; empty otherwise


class StatusView(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/status``: the cluster's nodes and every deployed service."""

    nodes: list[NodeView]
    services: list[ServiceStatus]
    control_plane: str = ""  # the control plane that places and scales now (the lease holder)
    active: bool = True  # whether the control plane that answered is that one (else a standby)
    insecure: list[str] = []  # what the control plane that answered runs without (its --insecure-* flags)
