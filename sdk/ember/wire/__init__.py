"""Wire types: every message that crosses a process boundary, as msgspec Structs.

Schemas only grow: new fields get defaults and go last; a field's type never changes. Encoders and
decoders are built once, here.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec

from ember._errors import InvalidSpecError
from ember._resources import GpuRequest

T = TypeVar("T")

# NATS headers of a queued call (synchronous calls travel in frames: see Invocation).
CALL_ID_HEADER = "Ember-Call-Id"
DEADLINE_HEADER = "Ember-Deadline"  # absolute, seconds since the epoch
PRIORITY_HEADER = "Ember-Priority"  # "interactive" | "batch"

# HTTP headers.
HTTP_TIMEOUT_HEADER = "X-Ember-Timeout"  # seconds; caps the function's timeout_s
HTTP_CALL_ID_HEADER = "X-Ember-Call-Id"
HTTP_BATCH_SIZE_HEADER = "X-Ember-Batch-Size"

# Events: headers a publisher may set, and those of the result message.
EVENT_REPLY_TO_HEADER = "Ember-Reply-To"  # publish the result here (overrides the function's result_subject)
EVENT_STATUS_HEADER = "Ember-Status"  # on a result: "succeeded" (body: the output) or "failed" (body: ErrorInfo)


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    """Micro-batching of a function's calls inside each replica.

    A batched function takes one argument, a ``list`` of inputs, and returns a list of outputs of
    the same length. Callers still send one input per call; the replica groups calls that arrive
    within ``window_ms`` of the first, up to ``max_size``.

    The replica dispatches at once when waiting would not pay (an idle replica at low load never waits
    for the window); ``latency_budget_ms`` caps how long the oldest call may wait plus the batch's
    predicted run time; ``max_cost`` bounds a batch by the summed cost of its inputs, given by the
    ``cost=`` function of the decorator (tokens, pixels, sequence length...). With ``group_by_cost`` a
    batch is filled with the waiting calls whose cost is closest to that of the most urgent one (which
    always goes first, so that no call waits forever), so that short and long inputs do not share a
    batch padded to the longest.

    Example:
        ``@app.function(batch=ember.Batch(max_size=32, window_ms=5))``
    """

    max_size: int = 32
    window_ms: float = 5.0
    latency_budget_ms: float | None = None
    max_cost: float | None = None
    group_by_cost: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_size, bool) or not isinstance(self.max_size, int) or not 1 <= self.max_size <= 4096:
            raise InvalidSpecError(f"Batch(max_size={self.max_size!r}): max_size must be an int from 1 to 4096")
        if isinstance(self.window_ms, bool) or not isinstance(self.window_ms, int | float) \
                or not 0 <= self.window_ms <= 10_000:
            raise InvalidSpecError(
                f"Batch(window_ms={self.window_ms!r}): window_ms must be a number of milliseconds from 0 to 10000")
        for knob in ("latency_budget_ms", "max_cost"):
            value = getattr(self, knob)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                raise InvalidSpecError(f"Batch({knob}={value!r}): {knob} is a positive number, or None")
        if not isinstance(self.group_by_cost, bool):
            raise InvalidSpecError(f"Batch(group_by_cost={self.group_by_cost!r}): group_by_cost is True or False")
        if self.group_by_cost and self.max_cost is None:
            raise InvalidSpecError("Batch(group_by_cost=True): grouping uses the inputs' costs; give max_cost "
                                   "(and cost= on the decorator) too")


class Retries(msgspec.Struct, frozen=True, kw_only=True):
    """How a queued (spawned or event) call that fails in user code is retried.

    Attempt ``k`` (1-based) is retried after ``min(initial_delay_s * backoff_coefficient**(k-1), max_delay_s)``;
    after ``max_retries`` retries the call fails and goes to the dead letters.

    Example:
        ``@app.function(retries=ember.Retries(max_retries=3, initial_delay_s=0.5))`` or ``retries=3``
    """

    max_retries: int = 0
    initial_delay_s: float = 1.0
    backoff_coefficient: float = 2.0
    max_delay_s: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) \
                or not 0 <= self.max_retries <= 100:
            raise InvalidSpecError(f"Retries(max_retries={self.max_retries!r}): an int from 0 to 100")
        for knob in ("initial_delay_s", "backoff_coefficient", "max_delay_s"):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InvalidSpecError(f"Retries({knob}={value!r}): a number >= 0")
        if self.backoff_coefficient < 1:
            raise InvalidSpecError(f"Retries(backoff_coefficient={self.backoff_coefficient!r}): at least 1")

    def delay_s(self, attempt: int) -> float:
        """The delay before retrying after failed attempt ``attempt`` (1-based)."""
        return min(self.initial_delay_s * self.backoff_coefficient ** max(attempt - 1, 0), self.max_delay_s)


InputMode = Literal["none", "single", "kwargs"]


class FunctionSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One callable entry point: a function, or one method of a class model."""

    name: str  # "embed" or "Classifier.predict": the URL path segment
    attr: str  # Python attribute: the function's or the method's name
    input_mode: InputMode
    params: list[str] = []
    input_schema: dict[str, Any] = {}
    output_schema: dict[str, Any] = {}
    batch: Batch | None = None
    on: list[str] = []  # NATS subjects whose messages are invocations (events)
    result_subject: str | None = None  # where an event's result is published, unless the message names one


class ServiceSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What runs in one replica: a function, or a class model with all its methods."""

    name: str
    kind: Literal["function", "class"]
    functions: list[FunctionSpec]
    gpu_count: int = 0
    gpu_types: list[str] = []
    min_replicas: int = 1
    max_replicas: int = 1
    timeout_s: float = 60.0
    retries: Retries = Retries()
    scaledown_window_s: float = 60.0
    buffer_replicas: int = 0
    gpu: GpuRequest | None = None  # the full request (memory share, MIG profile, topology); None: CPU only
    snap: bool = False  # it has @ember.setup(snap=True) methods: nodes may keep a zygote of it preloaded
    memory_mb: int = 0  # host memory one replica needs (memory=); 0: not declared
    target_p95_ms: float | None = None  # latency (queue wait + run) the autoscaler keeps p95 under; None: no target


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """The specs of an app, read by importing it."""

    app: str
    module: str  # import name of the app's file inside its bundle
    services: list[ServiceSpec]
    sdk_version: str = ""
    python: str = ""


class ScaleBounds(msgspec.Struct, frozen=True, kw_only=True):
    """Replica bounds of one service set at run time (``ember scale``), overriding its decorator's."""

    min_replicas: int
    max_replicas: int


class Deployment(msgspec.Struct, frozen=True, kw_only=True):
    """The current version of an app, stored in the deployments KV under the app's name."""

    app: str
    version: int
    bundle_sha256: str
    manifest: Manifest
    created_at: float
    scale: dict[str, ScaleBounds] = {}  # service name -> bounds set at run time

    def bounds(self, service: ServiceSpec) -> tuple[int, int]:
        """The service's (min, max) replicas: set at run time, else from its decorator."""
        override = self.scale.get(service.name)
        if override is not None:
            return override.min_replicas, override.max_replicas
        return service.min_replicas, service.max_replicas


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


class ZygoteAssignment(msgspec.Struct, frozen=True, kw_only=True):
    """A function version the scheduler wants preloaded on a node: a zygote process that has imported the
    app and run its ``@ember.setup(snap=True)`` methods, from which the node's replicas are forked."""

    app: str
    service: str
    version: int
    bundle_sha256: str
    module: str


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


class NodeAssignment(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one node should run, written by the scheduler in the assignments KV under the node's id."""

    node_id: str
    slots: list[SlotAssignment]
    updated_at: float
    zygotes: list[ZygoteAssignment] = []


ReplicaState = Literal["starting", "ready", "stopping", "crashed", "failed"]
# cold: the bundle was fetched for this start; artifact: it was on disk; zygote: forked from a preloaded zygote
StartKind = Literal["cold", "artifact", "zygote"]


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


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The one shape of every error, over HTTP (inside ``{"error": ...}``) and over NATS."""

    code: str
    message: str
    field: str | None = None
    type: str | None = None
    retry_after_s: float | None = None
    call_id: str | None = None


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    error: ErrorInfo


class Invocation(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One synchronous call, gateway to replica. A NATS message carries a list of them (a frame): the calls the
    gateway sent to the same subject in one turn of its event loop (see ``ember_platform.calls.router``)."""

    call_id: str
    function: str
    deadline: float  # absolute, seconds since the epoch
    priority: Literal["interactive", "batch"] = "interactive"
    input: msgspec.Raw = msgspec.Raw(b"null")  # the validated JSON body


class Answer(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A replica's word on one synchronous call, replica to gateway, also in lists (frames): either an ack,
    naming the replica that holds a call it has not answered yet, or the call's output (raw JSON) or error."""

    call_id: str
    ack: str = ""
    output: msgspec.Raw = msgspec.Raw(b"null")
    error: ErrorInfo | None = None
    batch_size: int = 0


CallStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "expired"]
FINAL_STATUSES = ("succeeded", "failed", "cancelled", "expired")


class CallRecord(msgspec.Struct, frozen=True, kw_only=True):
    """An asynchronous call, as ``GET /v1/calls/<id>`` shows it; ``output`` once it succeeded."""

    call_id: str
    app: str
    function: str
    status: CallStatus
    created_at: float
    updated_at: float
    attempts: int = 0
    output: msgspec.Raw = msgspec.Raw(b"null")  # the result, once succeeded
    error: ErrorInfo | None = None


class SpawnReply(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/<app>/<fn>/spawn`` -> 202."""

    call_id: str
    status: CallStatus
    created: bool = True  # False when an Idempotency-Key matched an earlier submit


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    """A call that failed its last attempt, kept with its input for inspection and replay."""

    call_id: str
    app: str
    function: str
    error: ErrorInfo
    attempts: int
    dead_at: float
    input: msgspec.Raw


class ReplayReply(msgspec.Struct, frozen=True, kw_only=True):
    replayed: list[str]  # the new call ids, in the order of the dead letters


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    """A replica's load for one function, published a few times a second; the gateway routes by it."""

    replica_id: str
    app: str
    function: str
    version: int
    queued: int
    in_flight: int
    per_call_s: float  # the replica's estimate of one call's share of a full batch; 0 until measured


class LogLine(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    stream: Literal["stdout", "stderr", "agent"]
    line: str
    ts: float


class DeployRequest(msgspec.Struct, frozen=True, kw_only=True):
    bundle_sha256: str
    manifest: Manifest


class ServiceView(msgspec.Struct, frozen=True, kw_only=True):
    """One service of an app as ``GET /v1/apps/<app>`` shows it."""

    name: str
    min_replicas: int
    max_replicas: int
    functions: list[str]
    replicas: list[ReplicaStatus]


class AppView(msgspec.Struct, frozen=True, kw_only=True):
    app: str
    version: int
    bundle_sha256: str
    created_at: float
    services: list[ServiceView]


FRAME_ITEM_OVERHEAD_BYTES = 512  # an Invocation's or Answer's fields beside its input or output, generously


def split_frames(items: list[T], sizes: list[int], limit: int) -> list[list[T]]:
    """``items`` in order, cut into frames that stay within ``limit`` bytes (a NATS message's maximum),
    counting each item as its size plus ``FRAME_ITEM_OVERHEAD_BYTES``; an item too large for any frame goes
    alone (and its publish fails)."""
    frames: list[list[T]] = []
    current: list[T] = []
    used = 0
    for item, size in zip(items, sizes, strict=True):
        size += FRAME_ITEM_OVERHEAD_BYTES
        if current and used + size > limit:
            frames.append(current)
            current, used = [], 0
        current.append(item)
        used += size
    if current:
        frames.append(current)
    return frames


encoder = msgspec.json.Encoder()
invocations_decoder = msgspec.json.Decoder(list[Invocation])
answers_decoder = msgspec.json.Decoder(list[Answer])
deployment_decoder = msgspec.json.Decoder(Deployment)
replica_decoder = msgspec.json.Decoder(ReplicaStatus)
node_decoder = msgspec.json.Decoder(NodeInfo)
log_decoder = msgspec.json.Decoder(LogLine)
assignment_decoder = msgspec.json.Decoder(NodeAssignment)
load_decoder = msgspec.json.Decoder(LoadReport)


# --- ``GET /v1/status`` (``ember status``) and ``POST /v1/apps/<app>/scale`` (``ember scale``) ---------


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


class StatusView(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/status``: the cluster's nodes and every deployed service."""

    nodes: list[NodeView]
    services: list[ServiceStatus]
