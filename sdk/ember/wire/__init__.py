"""The wire: every message that crosses a process boundary (NATS or HTTP), as msgspec Structs, and the protocol
pieces both sides of NATS share.

Schemas only grow: new fields get defaults and go last; a field's type never changes. The Structs, headers,
frames, the error conversion and the codec are importable from here and stay light (msgspec only); the NATS
plumbing (``jetstream``: connect, buckets, KV mirrors; ``callstore``: asynchronous calls' records) and the
subject names (``subjects``) are modules of their own.

| module | what |
| --- | --- |
| ``specs`` | what an app declares: ``Batch``, ``Retries``, function and service specs, ``Manifest``, ``Deployment`` |
| ``nodes`` | inventories, assignments, zygotes, replica states, load reports, log lines |
| ``calls`` | ``ErrorInfo``, ``Invocation`` / ``Answer`` (synchronous), ``CallRecord`` and dead letters (queued) |
| ``views`` | what ``GET /v1/apps`` and ``GET /v1/status`` show |
| ``tokens`` | bearer tokens: their format, their records, the bodies of ``/v1/tokens`` |
| ``quotas`` | quotas: their records, usage, the bodies of ``/v1/quotas`` |
| ``secrets`` | secrets: their records (encrypted), the bodies of ``/v1/secrets``, a node's request for them |
| ``headers`` | NATS and HTTP header names |
| ``frames`` | ``split_frames`` and the per-loop-turn ``Outbox`` |
| ``errors`` | ``EmberError`` <-> ``ErrorInfo`` |
| ``codec`` | the encoders, the hot decoders (JSON and msgpack frames), ``encode_output`` |
| ``tensors`` | OIP datatypes, tensor signatures, the compact form of arrays in msgpack frames |
"""

from ember.wire.calls import (
    FINAL_STATUSES,
    Answer,
    CallRecord,
    CallStatus,
    DeadLetter,
    ErrorBody,
    ErrorInfo,
    Invocation,
    ReplayReply,
    ReplayRequest,
    SpawnReply,
)
from ember.wire.codec import (
    answers_decoder,
    assignment_decoder,
    deployment_decoder,
    encode_output,
    encoder,
    invocations_decoder,
    is_json_frame,
    load_decoder,
    log_decoder,
    node_decoder,
    packed_answers_decoder,
    packed_encoder,
    packed_invocations_decoder,
    replica_decoder,
)
from ember.wire.errors import error_from_info, error_info
from ember.wire.frames import FRAME_ITEM_OVERHEAD_BYTES, Outbox, split_frames
from ember.wire.headers import (
    CALL_ID_HEADER,
    DEADLINE_HEADER,
    EVENT_REPLY_TO_HEADER,
    EVENT_STATUS_HEADER,
    HTTP_BATCH_SIZE_HEADER,
    HTTP_CALL_ID_HEADER,
    HTTP_TIMEOUT_HEADER,
    HTTP_VERSION_HEADER,
)
from ember.wire.nodes import (
    Device,
    FunctionStats,
    Histogram,
    LoadReport,
    LogLine,
    NodeAssignment,
    NodeInfo,
    ReplicaState,
    ReplicaStatus,
    SlotAssignment,
    StartKind,
    StartPhases,
    ZygoteAssignment,
    ZygoteState,
    ZygoteStatus,
)
from ember.wire.quotas import Quota, QuotaRequest, QuotaUsage, QuotaView
from ember.wire.secrets import SecretRequest, SecretsAnswer, SecretsRequest, SecretView, StoredSecret
from ember.wire.specs import (
    RESERVED_APP_NAMES,
    Batch,
    Deployment,
    DeployRequest,
    FunctionSpec,
    InputMode,
    Manifest,
    Release,
    Retries,
    RolloutRequest,
    ScaleBounds,
    ScaleRequest,
    ServiceSpec,
    TrafficShare,
)
from ember.wire.tokens import NewToken, StoredToken, TokenInfo, TokenRequest
from ember.wire.views import (
    AppView,
    DeviceView,
    NodeReplicaView,
    NodeView,
    ServiceStatus,
    ServiceView,
    StatusView,
    VersionView,
)
from ember.wire.volumes import (
    ChunksMissing,
    ChunksQuery,
    VolumeCommit,
    VolumeFile,
    VolumeFileView,
    VolumeMount,
    VolumeVersion,
    VolumeView,
)

__all__ = [
    "CALL_ID_HEADER",
    "DEADLINE_HEADER",
    "EVENT_REPLY_TO_HEADER",
    "EVENT_STATUS_HEADER",
    "FINAL_STATUSES",
    "FRAME_ITEM_OVERHEAD_BYTES",
    "HTTP_BATCH_SIZE_HEADER",
    "HTTP_CALL_ID_HEADER",
    "HTTP_TIMEOUT_HEADER",
    "HTTP_VERSION_HEADER",
    "RESERVED_APP_NAMES",
    "Answer",
    "AppView",
    "Batch",
    "CallRecord",
    "CallStatus",
    "ChunksMissing",
    "ChunksQuery",
    "DeadLetter",
    "DeployRequest",
    "Deployment",
    "Device",
    "DeviceView",
    "ErrorBody",
    "ErrorInfo",
    "FunctionSpec",
    "FunctionStats",
    "Histogram",
    "InputMode",
    "Invocation",
    "LoadReport",
    "LogLine",
    "Manifest",
    "NewToken",
    "NodeAssignment",
    "NodeInfo",
    "NodeReplicaView",
    "NodeView",
    "Outbox",
    "Quota",
    "QuotaRequest",
    "QuotaUsage",
    "QuotaView",
    "Release",
    "ReplayReply",
    "ReplayRequest",
    "ReplicaState",
    "ReplicaStatus",
    "Retries",
    "RolloutRequest",
    "ScaleBounds",
    "ScaleRequest",
    "SecretRequest",
    "SecretView",
    "SecretsAnswer",
    "SecretsRequest",
    "ServiceSpec",
    "ServiceStatus",
    "ServiceView",
    "SlotAssignment",
    "SpawnReply",
    "StartKind",
    "StartPhases",
    "StatusView",
    "StoredSecret",
    "StoredToken",
    "TokenInfo",
    "TokenRequest",
    "TrafficShare",
    "VersionView",
    "VolumeCommit",
    "VolumeFile",
    "VolumeFileView",
    "VolumeMount",
    "VolumeVersion",
    "VolumeView",
    "ZygoteAssignment",
    "ZygoteState",
    "ZygoteStatus",
    "answers_decoder",
    "assignment_decoder",
    "deployment_decoder",
    "encode_output",
    "encoder",
    "error_from_info",
    "error_info",
    "invocations_decoder",
    "is_json_frame",
    "load_decoder",
    "log_decoder",
    "node_decoder",
    "packed_answers_decoder",
    "packed_encoder",
    "packed_invocations_decoder",
    "replica_decoder",
    "split_frames",
]
