"""What an app declares, as the platform stores it: batching, retries, function and service specs, the
manifest, deployments and run-time bounds (``ember scale``)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ember._errors import InvalidSpecError
from ember._resources import GpuRequest
from ember.wire.bounds import MaxReplicas, MinReplicas, Version
from ember.wire.images import ImageSpec
from ember.wire.schedules import ScheduleSpec
from ember.wire.tensors import TensorSignature
from ember.wire.volumes import VolumeMount


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


class Continuous(msgspec.Struct, frozen=True, kw_only=True):
    """Continuous (iteration-level) batching of a decoder's steps inside each replica.

    The method takes the running sequences (``list[ember.Sequence]``) and returns one piece of text for each (None:
    that sequence ends). A new call becomes a sequence that joins at the next step; a sequence leaves when its
    piece is None, at its ``max_tokens``, at a stop string, or when its caller goes away, freeing its slot.

    Example:
        ``@ember.method(openai="tiny-gpt", batch=ember.Continuous(max_seqs=32))``
    """

    max_seqs: int = 32

    def __post_init__(self) -> None:
        if isinstance(self.max_seqs, bool) or not isinstance(self.max_seqs, int) or not 1 <= self.max_seqs <= 4096:
            raise InvalidSpecError(f"Continuous(max_seqs={self.max_seqs!r}): max_seqs must be an int from 1 to 4096")


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

# The first path segments of the HTTP API's own routes under /v1 (and the probes'): no app may take one as its name,
# so that ``POST /v1/<app>/<fn>`` never shadows a route of the API.
RESERVED_APP_NAMES = frozenset({"apps", "bundles", "calls", "events", "healthz", "quotas", "readyz", "secrets",
                                "stats", "status", "subjects", "tokens", "volumes"})

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
    public: bool = False  # its synchronous call (POST /v1/<app>/<fn>) needs no token; nothing else of it is public
    max_body_bytes: int = 0  # the largest request body its calls take (max_body_bytes=); 0: the platform's default
    tensors: TensorSignature | None = None  # its parameters and result are arrays: an Open Inference Protocol model
    stream: bool = False  # a generator: its items stream to the caller (SSE or NDJSON); queued calls store the list
    is_async: bool = False  # ``async def`` (or an async generator): runs on the replica's event loop
    max_concurrency: int = 1  # calls one replica runs at once (threads for sync code, tasks on the loop for async)
    openai: str = ""  # served as this model on /openai/v1 (a generator of text pieces); "": not
    continuous: Continuous | None = None  # a decoder's step under continuous batching (max_concurrency: max_seqs)
    schedule: ScheduleSpec | None = None  # it runs by itself (ember.Period / ember.Cron): see ``wire.schedules``


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
    startup_timeout_s: float = 600.0  # a replica's import and setup, at most; longer counts as a failed setup
    secrets: list[str] = []  # names of secrets whose keys and values its replicas get as environment variables
    volumes: list[VolumeMount] = []  # volumes mounted read-only in its replicas (pinned to a version at deploy)
    image: ImageSpec | None = None  # its Python environment (locked at push); None: the node's own
    block_network: bool = False  # its replicas reach NATS and nothing else: no way out of their own network


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """The specs of an app, read by importing it."""

    app: str
    module: str  # import name of the app's file inside its bundle
    services: list[ServiceSpec]
    sdk_version: str = ""
    python: str = ""
    calls: list[str] = []  # other apps whose functions its code may call (``App(calls=[...])``); its own always


class ScaleBounds(msgspec.Struct, frozen=True, kw_only=True):
    """Replica bounds of one service set at run time (``ember scale``), overriding its decorator's."""

    min_replicas: int
    max_replicas: int


class ScaleRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/apps/<app>/scale`` (``ember scale``): one service's bounds at run time."""

    service: str
    min_replicas: MinReplicas
    max_replicas: MaxReplicas


class Release(msgspec.Struct, frozen=True, kw_only=True):
    """One version of an app other than its deployment's own, kept for rollback, pinned calls and the replicas
    that still serve it."""

    version: int
    bundle_sha256: str
    manifest: Manifest
    created_at: float


class TrafficShare(msgspec.Struct, frozen=True, kw_only=True):
    """The share (in percent) of an app's unpinned calls that one of its versions takes."""

    version: int
    percent: int


class Deployment(msgspec.Struct, frozen=True, kw_only=True):
    """An app's deployment, stored in the deployments KV under the app's name.

    ``version`` (with its bundle and manifest) is the version being rolled out or serving: its replicas are
    started first; ``traffic`` says which versions take the unpinned calls now. A new version enters ``traffic``
    only once its minimum replicas are ready (the control loop switches it), so a push never makes calls wait
    for a cold start. During a canary (``canary_percent``), ``version`` takes that share and ``stable`` the
    rest until ``ember promote`` or ``ember rollback``."""

    app: str
    version: int
    bundle_sha256: str
    manifest: Manifest
    created_at: float
    scale: dict[str, ScaleBounds] = {}  # service name -> bounds set at run time
    releases: list[Release] = []  # the other versions kept, oldest first (serving ones, then recent ones)
    traffic: list[TrafficShare] = []  # who takes unpinned calls now; empty: all to ``version``
    canary_percent: int = 0  # 1..99: ``version`` is a canary that takes this share once ready
    stable: int = 0  # during a canary, the version that takes the rest
    switched_at: float = 0.0  # when ``traffic`` last changed (the versions it left drain after a grace period)
    latest: int = 0  # the highest version ever recorded (a push after a rollback gets the next one)
    warm: int = 0  # the version that last left ``traffic``: its replicas stay, taking no calls, for a quick rollback
    warm_since: float = 0.0  # when it left (it stays ``EMBER_KEEP_PREVIOUS_S``, see ``control.switching``)
    born_at: float = 0.0  # when the app's first version was pushed, kept by the later ones: what tells it from an app
    # of its name deleted before (whose versions had the same numbers); 0 for an app first pushed before it was kept

    def bounds(self, service: ServiceSpec) -> tuple[int, int]:
        """The service's (min, max) replicas: set at run time, else from its decorator."""
        override = self.scale.get(service.name)
        if override is not None:
            return override.min_replicas, override.max_replicas
        return service.min_replicas, service.max_replicas

    def serving(self) -> list[TrafficShare]:
        """Who takes unpinned calls now (a deployment recorded before rollouts: all to ``version``)."""
        return self.traffic or [TrafficShare(version=self.version, percent=100)]

    def running(self) -> set[int]:
        """The versions that have replicas: the one being rolled out and those that take calls."""
        return {self.version} | {share.version for share in self.serving()}

    def release(self, version: int) -> Release | None:
        """The version's bundle and manifest, if it is kept."""
        if version == self.version:
            return Release(version=self.version, bundle_sha256=self.bundle_sha256, manifest=self.manifest,
                           created_at=self.created_at)
        return next((r for r in self.releases if r.version == version), None)

    def at(self, version: int) -> Deployment | None:
        """This deployment seen as if ``version`` were its own (for the replicas and calls of that version)."""
        if version == self.version:
            return self
        kept = self.release(version)
        if kept is None:
            return None
        return msgspec.structs.replace(self, version=kept.version, bundle_sha256=kept.bundle_sha256,
                                       manifest=kept.manifest, created_at=kept.created_at)


class DeployRequest(msgspec.Struct, frozen=True, kw_only=True):
    bundle_sha256: str
    manifest: Manifest
    canary_percent: int = 0  # 1..99: roll out as a canary taking this share of calls (0: a full rollout)


class RolloutRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/apps/<app>/rollback`` (``version``: 0 for the one before) and ``.../promote`` (no fields)."""

    version: Version = 0
