"""Calls on the wire: the one error shape, synchronous calls and their answers (in frames, see ``frames``), and
asynchronous calls' records, dead letters and replays."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec


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


class Hop(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One call of a chain of calls between functions (see ``ember.wire.relay``): which function, and which call."""

    app: str
    function: str
    call_id: str = ""


class Invocation(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One synchronous call, gateway to replica. A NATS message carries a list of them (a frame): the calls the
    gateway sent to the same subject in one turn of its event loop (see ``ember_platform.calls.router``).

    A frame is JSON, or msgpack when its calls carry binary or msgpack bodies (no base64 on the way); a JSON frame
    starts with ``[``, which no msgpack array does (``is_json_frame``). Answers come back in their frame's codec."""

    call_id: str
    function: str
    deadline: float  # absolute, seconds since the epoch
    input: msgspec.Raw = msgspec.Raw(b"null")  # the validated body: JSON in a JSON frame, msgpack in a msgpack one
    compact: bool = False  # answer arrays as compact tensors (msgpack frames: the Open Inference Protocol's routes)
    chain: list[Hop] = []  # a call made by functions: the calls waiting on it, outermost first (empty from HTTP)
    trace: dict[str, str] = {}  # W3C trace context (traceparent, tracestate) of the gateway's span; empty untraced
    bundles: bool = False  # a streamed call: its caller reads ``StreamBundle``s too (see ``ember.wire.streams``)


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
    input_sha256: str = ""  # of the body, for a call submitted with an Idempotency-Key (a reuse must match it)
    replica: str = ""  # the replica running it (set with "running"): where a cancel goes
    cancelled_by: str = ""  # who cancelled it: a token's id, or ``app <name>`` for a function's code
    cancelled_at: float | None = None  # when (seconds since the epoch)
    started_at: float | None = None  # when its last attempt started to run (set with "running"; kept when final)


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
    seq: int = 0  # its sequence in the dead letters' stream, as read (the cursor for ``?after=``); 0 as stored


MAX_REPLAY = 10_000  # dead letters one replay resubmits at most (and call ids it names): call again for the rest


class ReplayRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/apps/<app>/dead/replay``: resubmit a function's dead letters (all, or those named), those there when
    it came, ``MAX_REPLAY`` at most."""

    function: str
    call_ids: Annotated[list[str], msgspec.Meta(max_length=MAX_REPLAY)] | None = None


class ReplayReply(msgspec.Struct, frozen=True, kw_only=True):
    replayed: list[str]  # the new call ids, in the order of the dead letters
