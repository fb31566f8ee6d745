"""Calls between functions: what a replica's code sends on ``ember.relay.<replica id>`` and what it gets back.

A function that calls another (``other.remote()``, ``.spawn()``, ``.map()``, a spawned call's ``.get()``) does not
go over HTTP: the SDK inside a replica sends a :data:`RelayRequest` over the replica's own NATS connection to its
relay subject, which only that replica may publish to. A control plane (one queue group) answers: it knows the
caller from the subject, checks that the caller's app may call the target, validates the input against the target's
schema, caps the deadline, refuses a cycle, and routes the call as the gateway does. The answer's ``output`` holds
exactly what the matching HTTP route answers on success (the result's JSON, a ``SpawnReply``, a ``CallRecord``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ember.wire.calls import CallRecord, ErrorInfo, Hop

MAX_CHAIN = 16  # calls waiting on one another, at most: a deeper chain is refused (each holds a replica's slot)
MAX_CALLERS = 4096  # the calls of one batch, at most (``Batch.max_size``'s bound)
MAX_CALLER_ID = 512  # a call id's length, at most (as the control plane checks ``caller_call_id``)
CallerId = Annotated[str, msgspec.Meta(max_length=MAX_CALLER_ID)]
CallerIds = Annotated[list[CallerId], msgspec.Meta(max_length=MAX_CALLERS)]


class RelayInvoke(msgspec.Struct, frozen=True, kw_only=True, tag="invoke"):
    """``other.remote(x)`` from a replica: a synchronous call, answered with the result's JSON."""

    app: str
    function: str
    input: msgspec.Raw
    deadline: float = 0.0  # absolute, seconds since the epoch: the caller's (0: none; the target's timeout_s caps it)
    caller_function: str = ""  # the replica's function whose call makes this one ("" outside any call)
    caller_call_id: str = ""
    chain: list[Hop] = []  # the calls waiting on the caller's call, outermost first, as its replica received them
    # A batch's call: every call the batch serves (``caller_call_id`` first). The call is cancelled only once all of
    # them are, since the batch runs on for the others; empty: ``caller_call_id`` alone (and from older SDKs).
    caller_call_ids: CallerIds = []


class RelaySpawn(msgspec.Struct, frozen=True, kw_only=True, tag="spawn"):
    """``other.spawn(x)`` from a replica: queue a call (it starts a chain of its own); answered with a SpawnReply."""

    app: str
    function: str
    input: msgspec.Raw
    timeout_s: float | None = None
    idempotency_key: str | None = None
    # The calls the spawning code serves (a batch's: all of them): refused once every one of them was cancelled.
    # Empty: outside any call (and from older SDKs).
    caller_call_ids: CallerIds = []


class RelayRecord(msgspec.Struct, frozen=True, kw_only=True, tag="record"):
    """A spawned call's record (``FunctionCall.get()``/``.status()``), long-polled up to ``wait_s``."""

    call_id: str
    wait_s: float = 0.0


class RelayCancel(msgspec.Struct, frozen=True, kw_only=True, tag="cancel"):
    """``FunctionCall.cancel()`` from a replica."""

    call_id: str


class RelayCallRead(msgspec.Struct, frozen=True, kw_only=True, tag="read"):
    """A replica's read of a queued call of its own app (as its queue worker takes one): its status record
    (``kind="s"``) or its final record (``"r"``), answered with the ``CallRecord`` or null.

    A replica reads no store itself: the answer to a JetStream read goes to whatever reply subject its request names,
    and a stored value it wrote, answered to another bucket's subject, would be stored there (a record, a token)."""

    call_id: str
    kind: Literal["s", "r"]
    output: bool = True  # a final record's large output read from its chunks (False: whether there is one, cheaply)


class RelayCallTake(msgspec.Struct, frozen=True, kw_only=True, tag="take"):
    """A replica's queue worker takes a queued call of its own app: a control plane marks its status running on that
    replica and answers a ``TakeReply`` (``CallStore.take``): one round trip where the worker read, wrote and read."""

    call_id: str
    function: str
    attempt: int = 1


class TakeReply(msgspec.Struct, frozen=True, kw_only=True):
    record: CallRecord  # the call's status record, as marked running
    finished: bool  # it has a final record already: not to be run


RelayRequest = RelayInvoke | RelaySpawn | RelayRecord | RelayCancel | RelayCallRead | RelayCallTake


class RelayReply(msgspec.Struct, frozen=True, kw_only=True):
    """The control plane's answer: ``output`` (what the HTTP route answers) or ``error``."""

    output: msgspec.Raw = msgspec.Raw(b"null")
    error: ErrorInfo | None = None


request_decoder = msgspec.json.Decoder(RelayRequest)  # type: ignore[arg-type]
reply_decoder = msgspec.json.Decoder(RelayReply)
