"""JetStream's atomic batch publish (nats-server 2.12+, ADR-50): up to ``MAX_BATCH`` messages to one stream, stored
together or not at all, acknowledged once.

Why: the schedule loop writes a thousand call records, queue messages and schedule states at one tick. Each as a
request of its own costs nats-py ~30 µs of Python (a future, ``wait_for``, the ack's JSON) and nats-server an ack;
a batch sends the messages as plain publishes and awaits two replies (the batch's start and its commit): about a
sixth of the client's CPU (bench/schedules.py).

A message's expectations (``Nats-Expected-Last-Subject-Sequence``, a ``Nats-Msg-Id`` already seen) are checked at
the commit, for the whole batch: one that fails refuses every message (``BatchRefused``, nothing stored). So are
batches beyond the server's limits (50 in flight per stream: another client's batches left open can take them for
10 s). A caller therefore keeps its message-by-message path and takes it for what a batch did not store: a refused
batch, and a batch whose commit went unanswered (perhaps stored: what it sends again must be idempotent, which
creates, compare-and-sets and ``Nats-Msg-Id`` publishes are).

Only streams whose configuration allows it take batches (``allow_atomic``, set by ``allow_atomic``); the others, on a
server older than 2.12 too, are written message by message (``atomic_allowed`` says which)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec
from nats.errors import Error as NatsError

log = logging.getLogger("ember.atomic")
MAX_BATCH = 1000  # nats-server's limit on the messages of one batch
BATCH_ID, BATCH_SEQUENCE, BATCH_COMMIT = "Nats-Batch-Id", "Nats-Batch-Sequence", "Nats-Batch-Commit"

Message = tuple[str, bytes, dict[str, str]]  # subject, payload, headers


class BatchRefused(Exception):
    """The stream stored none of the batch: ``err_code`` is JetStream's (10071 a wrong last sequence, 10201 a
    ``Nats-Msg-Id`` seen before, 10210 too many batches in flight, ...)."""

    def __init__(self, err_code: int, description: str) -> None:
        super().__init__(f"{description} ({err_code})")
        self.err_code = err_code
        self.description = description


class _Error(msgspec.Struct):
    err_code: int = 0
    description: str = ""


class _Ack(msgspec.Struct):
    error: _Error | None = None
    seq: int = 0
    count: int = 0


_ack_decoder = msgspec.json.Decoder(_Ack)


async def publish_atomic(js: Any, messages: Sequence[Message], timeout: float = 5.0) -> int:
    """Publish ``messages`` (1 to ``MAX_BATCH``, to one stream that allows it) as one atomic batch through the
    connection of JetStream context ``js``; the stream's sequence of the last (the others precede it, in order).
    ``BatchRefused`` when the stream stored none of them; a ``TimeoutError`` or a NATS error when the outcome is
    unknown."""
    if not 0 < len(messages) <= MAX_BATCH:
        raise ValueError(f"an atomic batch holds 1 to {MAX_BATCH} messages, not {len(messages)}")
    nc = js._nc  # nats-py's JetStreamContext names its connection nowhere else
    batch = uuid.uuid4().hex
    last = len(messages)
    for n, (subject, payload, headers) in enumerate(messages, 1):
        headers = {**headers, BATCH_ID: batch, BATCH_SEQUENCE: str(n)}
        if n == last:
            headers[BATCH_COMMIT] = "1"
        if n == 1 or n == last:  # the start is acknowledged (empty) or refused; the commit answers for the batch
            reply = await nc.request(subject, payload, headers=headers, timeout=timeout)
            if reply.data:
                ack = _ack_decoder.decode(reply.data)
                if ack.error is not None:
                    raise BatchRefused(ack.error.err_code, ack.error.description)
                if n == last:
                    return ack.seq
        else:
            await nc.publish(subject, payload, headers=headers)
    raise AssertionError("unreachable: the last message returns")


async def try_atomic(js: Any, messages: Sequence[Message], what: str) -> int | None:
    """``publish_atomic``, or None, said in the log, where the batch was refused or its outcome is unknown: the
    caller then writes ``messages``' contents one by one (idempotently, see the module's docstring)."""
    try:
        return await publish_atomic(js, messages)
    except (BatchRefused, NatsError, OSError, TimeoutError) as exc:
        log.info("a batch of %d %s went one by one: %s", len(messages), what, exc)
        return None


async def allow_atomic(js: Any, stream: str) -> bool:
    """Let ``stream`` take atomic batches (an upgraded installation's streams were made without); whether it does.
    False on a server that does not know the setting (older than 2.12), which then leaves it unset."""
    try:
        config = (await js.stream_info(stream)).config
        if not config.allow_atomic:
            config = (await js.update_stream(config.evolve(allow_atomic=True))).config
    except (NatsError, OSError, TimeoutError) as exc:
        log.warning("%s takes no atomic batches (%s): its writes go one by one", stream, exc)
        return False
    return bool(config.allow_atomic)


async def atomic_allowed(js: Any, stream: str) -> bool:
    """Whether ``stream`` takes atomic batches now (its configuration, read once by the caller)."""
    try:
        return bool((await js.stream_info(stream)).config.allow_atomic)
    except (NatsError, OSError, TimeoutError):
        return False
