"""What nodes and replicas report and what the scheduler assigns them: devices, inventories, assignments,
zygotes, replica states with their start phases and batching counters, load reports and log lines."""

from __future__ import annotations

from typing import Literal

import msgspec

from ember.wire.images import ImageSpec
from ember.wire.volumes import VolumeMount


class Device(msgspec.Struct, frozen=True, kw_only=True):
    kind: Literal["cpu", "gpu"]
    index: int
    name: str
    memory_total_mb: int = 0
    uuid: str = ""
    memory_free_mb: int | None = None  # None: not reported
    utilization: float = 0.0  # compute busy share, 0..1, as last sampled
    mig_enabled: bool = False  # a GPU in MIG mode: replicas run only on its slices
    mig_profile: str = ""  # a MIG slice ("1g.10gb"); index is then its GPU's index
    parent_uuid: str = ""  # a MIG slice: the uuid of its GPU
    nvlink_peers: list[int] = []  # indices of this node's GPUs reached over an active NVLink
    numa_node: int = -1  # -1: unknown
    xid: int = 0  # the last Xid error its driver reported (a MIG slice: its GPU's); 0: none since its agent started
    fault: str = ""  # why it is out of service (a critical Xid error): nothing is placed on it, and its replicas move


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    hostname: str
    devices: list[Device]
    updated_at: float
    cpu_cores: int = 0  # 0: not reported
    memory_mb: int = 0  # host memory; 0: not reported
    bundles: list[str] = []  # bundle / snapshot keys cached on the node
    host_memory_reserved_mb: int = 0  # what the node's replicas reserved of memory_mb
    zygotes: list[ZygoteStatus] = []  # the preloaded zygotes the node holds
    volumes: list[str] = []  # volume versions cached on the node, as ``name@vN`` (placement prefers them)
    environments: list[str] = []  # image environments (their sha256) built on the node
    warm_starts: dict[str, str] = {}  # app -> "starting" or "ready": a warm start the node holds that it asked for
    # replica id -> device uuid -> MB of GPU memory its processes use, as last sampled (every GPU replica)
    replica_gpu_memory_mb: dict[str, dict[str, int]] = {}
    sandbox: str = ""  # how replicas are held: "bwrap" (with "own network" or "node network"), "none"; "": unknown
    isolation_notes: list[str] = []  # what replicas here lack (no sandbox, the node's network, no process limit)
    # whether its GPU replicas may fork from any zygote of their version: not where each sandbox binds its GPUs'
    # device nodes (there a replica forks only from a zygote whose sandbox holds its GPUs); True when not said
    gpu_forks: bool = True
    # whether it builds a zygote's sandbox with the GPUs its assignment names (``ZygoteAssignment.gpus``), so that
    # where ``gpu_forks`` is false its GPU replicas on those GPUs fork; False from an agent that does not say
    gpu_zygotes: bool = False


class SlotAssignment(msgspec.Struct, frozen=True, kw_only=True):
    """One replica the scheduler wants on a node, and the devices it may see."""

    replica_id: str
    app: str
    service: str
    version: int
    index: int
    gpu_uuids: list[str] = []  # CUDA_VISIBLE_DEVICES (a MIG slice by its uuid)
    gpu_indices: list[int] = []
    numa_node: int = -1
    bundle_sha256: str = ""
    module: str = ""  # the app's module in its bundle
    memory_mb: int = 0  # per GPU, for replicas that share GPUs by memory; 0: each GPU whole
    host_memory_mb: int = 0  # host memory the replica reserved; 0: not declared
    cpu_millis: int = 0  # CPU the replica reserved; 0: not declared
    startup_timeout_s: float = 0.0  # the service's; 0: no limit
    secrets: bool = False  # the service declares secrets: its agent asks a control plane for them at start
    volumes: list[VolumeMount] = []  # fetched into the node's volume cache before it starts, mounted read-only
    image: ImageSpec | None = None  # its locked image: the node builds (or reuses) its environment before it starts
    block_network: bool = False  # its service's block_network=True: its sandbox's own network has no way out


class ZygoteAssignment(msgspec.Struct, frozen=True, kw_only=True):
    """A function version the scheduler wants preloaded on a node: a zygote process that has imported the
    app and run its ``@ember.setup(snap=True)`` methods, from which the node's replicas are forked."""

    app: str
    service: str
    version: int
    bundle_sha256: str
    module: str
    volumes: list[VolumeMount] = []  # fetched before the zygote is built, mounted in its sandbox
    image: ImageSpec | None = None  # the zygote runs in this image's environment
    block_network: bool = False  # its service's block_network=True: so do the replicas forked from it
    spares: int = 1  # children it keeps forked ahead of their requests: the starts expected on this node soon
    # on a node whose sandboxes bind their GPUs' device nodes (``NodeInfo.gpu_forks`` false): the GPUs (uuids) whose
    # device nodes its sandbox holds, those of the replicas placement would start there next; only a replica given
    # exactly these forks from it. Empty: none (a CPU service's zygote, or any zygote on a node without sandboxes)
    gpus: list[str] = []
    host_memory_mb: int = 0  # its service's memory= (what each replica forked from it is bounded by): its own bound


ZygoteState = Literal["building", "ready", "failed"]


class ZygoteStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A zygote as its node reports it."""

    app: str
    service: str
    version: int
    state: ZygoteState
    pid: int = 0
    rss_mb: int = 0  # host memory it holds (resident set)
    build_s: float = 0.0  # interpreter, imports and snap setup, when it was built
    forks: int = 0  # replicas started from it
    failures: int = 0  # builds or forks that failed on this node for this version (each fell back to a fresh start)
    message: str = ""
    spares: int = 0  # children it keeps forked ahead of their requests (a start is then a hand-over, not a fork)
    gpus: list[str] = []  # the GPUs whose device nodes its sandbox holds (``ZygoteAssignment.gpus``)


class NodeAssignment(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one node should run, written by the scheduler in the assignments KV under the node's id."""

    node_id: str
    slots: list[SlotAssignment]
    updated_at: float
    zygotes: list[ZygoteAssignment] = []

ReplicaState = Literal["starting", "ready", "stopping", "crashed", "failed"]


# cold: the bundle was fetched for this start; artifact: it was on disk; zygote: forked from a preloaded zygote
StartKind = Literal["cold", "artifact", "zygote", "warm"]


class StartPhases(msgspec.Struct, frozen=True, kw_only=True):
    """Where a replica's start went, in seconds, from the agent's decision to start it."""

    kind: StartKind
    fetch_s: float  # bundle download, verification and unpacking (0 when on disk)
    interpreter_s: float  # a fresh interpreter and Ember's own imports (0 when forked)
    imports_s: float  # importing the app (torch and the like; 0 when forked: the zygote did it)
    setup_s: float  # the class's @ember.setup methods (only the per-replica ones when forked)
    ready_s: float  # decision to ready, all together
    first_call_s: float | None = None  # ready to the first answered call
    fork_s: float = 0.0  # decision to running in the forked child (zygote starts only)
    snap_setup_s: float = 0.0  # the @ember.setup(snap=True) methods: paid once, by the zygote, before the decision
    modules: list[str] = []  # the heavy libraries its app imported as it loaded (torch and the like): warm starts do


class Histogram(msgspec.Struct, frozen=True, kw_only=True):
    """Cumulative-ready histogram: ``counts[i]`` observations <= ``bounds[i]``, the last one above all."""

    bounds: list[float]
    counts: list[int]
    sum: float
    count: int


class FunctionStats(msgspec.Struct, frozen=True, kw_only=True):
    """One function's batching counters in one replica, since the replica started."""

    function: str
    calls: int
    batches: int
    expired: int
    rejected: int
    cancelled: int
    failed: int
    queue_depth: int
    fill_ratio: float
    batch_size: Histogram
    queue_wait_s: Histogram
    run_s: Histogram
    in_flight: int = 0
    sequences: int | None = None  # a Continuous step's running sequences (None: not a Continuous step)


class ReplicaStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A replica's state, reported by the replica itself and by its node agent."""

    replica_id: str
    node_id: str
    app: str
    service: str
    version: int
    state: ReplicaState
    pid: int
    started_at: float
    updated_at: float
    restarts: int = 0
    message: str = ""
    calls: int = 0
    batches: int = 0
    functions: list[FunctionStats] = []
    start: StartPhases | None = None
    restart_reason: str = ""  # why the agent restarted the previous process (e.g. over its GPU memory)
    # why the replica stopped taking calls on its own while assigned, to be replaced: "health" (its @ember.health
    # check failed) or "stuck" (a call ran past its timeout_s)
    gave_way: str = ""


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    """A replica's load for one function, published a few times a second; the gateway routes by it."""

    replica_id: str
    app: str
    function: str
    version: int
    queued: int
    in_flight: int
    per_call_s: float  # the replica's estimate of one call's share of a full batch; 0 until measured
    slots: int = 1  # calls (batches) it runs at once: its function's max_concurrency; per_call_s counts them
    accepted: int = 0  # the streams the replica accepted so far (all its functions): a gateway knows which of the
    #                    streams it sent there this report counts (an accept's own count is at most this)


class LogLine(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    stream: Literal["stdout", "stderr", "agent"]
    line: str
    ts: float
    node_id: str = ""  # set by the control plane from the subject the line came on, not by its publisher
