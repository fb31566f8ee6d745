"""Asynchronous calls' state in JetStream, shared by the platform and the replicas.

Each call has two keys in the ``ember_calls`` KV bucket, under its app: ``s.<app>.<id>``, its status while it waits or
runs, and ``r.<app>.<id>``, its final record. The app in the key is what confines a replica: its NATS permissions
name its own app's keys, so it can neither read nor write another app's calls (``ember_platform.natsauth``). The
final record is written with ``create`` (only if absent; the run's start in a header beside it, ``STARTED_AT_HEADER``),
so the first writer wins: a late duplicate of a redelivered call, or a cancel racing a finish, can never overwrite or
duplicate a result. Outputs too large for a
record go to the ``ember_results`` bucket in chunks, ``<app>.<id>.<writer>.<n>`` (a name of their own writer's),
written before the record that points at them: the winner's record always points at the winner's chunks, and a
writer that lost removes its own.

Who reads what: a replica its own app's keys, by key; the control plane any call by its id alone, since the id names
its app (``app_of``): a spawned call's id is ``<app>_<32 hexadecimal digits>``, an event's ``ev-<scope>-...`` or
``evs-<scope>-...``, whose scope is a digest of its function's event stream. A replica may write any key of its own
app, never one that an id of another app leads to.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from nats.js.api import Header
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError, NotFoundError
from nats.js.kv import KeyValue

from ember.wire import CallRecord, CallStatus, DeadLetter, ErrorInfo, encoder, subjects
from ember.wire.headers import STARTED_AT_HEADER
from ember.wire.jetstream import RESULT_CHUNK_BYTES

MAX_INLINE_OUTPUT = 256 * 1024
# The most a record's output may claim to be made of (a record is its replica's to write, any number in it): 1 GiB
# of chunks, read a few at a time. Claiming a million once made a control plane send a million reads at once.
MAX_CHUNKS = (1 << 30) // RESULT_CHUNK_BYTES
READ_CHUNKS_AT_ONCE = 16
_record_decoder = msgspec.json.Decoder(CallRecord)
_ABSENT = (KeyNotFoundError, NotFoundError, NoKeysError)
_WRONG_LAST_SEQUENCE = (10071, 10164)  # JetStream's "wrong last sequence": the key exists (as nats-py reads it)
_SPAWNED = re.compile(r"([a-z0-9][a-z0-9-]{0,62})_[0-9a-f]{32}")
_EVENT = re.compile(r"evs?-([0-9a-f]{12})-.+")


def new_call_id(app: str) -> str:
    """A new id for a call of ``app`` that the platform queues: the app, then 128 random bits."""
    return f"{subjects.check_token(app, 'app')}_{uuid.uuid4().hex}"


def app_of(call_id: str, event_app: Callable[[str], str | None]) -> str | None:
    """The app a call id belongs to: written in a spawned call's id, found from the scope of an event's id by
    ``event_app`` (scope -> app, from what is deployed); None for an id of neither form."""
    event = _EVENT.fullmatch(call_id)
    if event is not None and (app := event_app(event[1])) is not None:
        return app
    spawned = _SPAWNED.fullmatch(call_id)
    return spawned[1] if spawned is not None else None


class _ChunksRef(msgspec.Struct, frozen=True):
    """The output of a record whose output is in ``ember_results``: ``chunks`` keys ``<name>.<n>``."""

    ember_result: str = msgspec.field(name="$ember_result")
    name: str = ""
    chunks: int = 0


_ref_decoder = msgspec.json.Decoder(_ChunksRef)


class CallStore:
    def __init__(self, js: Any, calls: KeyValue, results: KeyValue) -> None:
        self._js = js
        self._kv = calls
        self._results = results

    async def create_status(self, record: CallRecord) -> CallRecord | None:
        """Record a new call as queued; returns the existing record instead when the id is taken."""
        try:
            await self._kv.create(subjects.call_key("s", record.app, record.call_id), encoder.encode(record))
            return None
        except KeyWrongLastSequenceError:
            return await self.get(record.app, record.call_id)

    def create_status_message(self, record: CallRecord) -> tuple[str, bytes, dict[str, str]]:
        """``create_status`` as a message (subject, value, headers) for an atomic batch (``ember.wire.atomic``): stored
        only if the key has no value, as ``create``; a batch holding one whose key has one is refused whole."""
        return (f"{self._kv._pre}{subjects.call_key('s', record.app, record.call_id)}", encoder.encode(record),
                {Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: "0"})

    async def call_id_for_key(self, app: str, key_hash: str, call_id: str) -> str:
        """The call id an idempotency key of ``app`` maps to (``k.<app>.<key hash>``): ``call_id`` when this writer
        stored the mapping first, else the first writer's. The mapping expires with the records (the bucket's TTL)."""
        key = subjects.call_key("k", app, key_hash)
        while True:
            try:
                await self._kv.create(key, call_id.encode())
                return call_id
            except KeyWrongLastSequenceError:
                try:
                    entry = await self._kv.get(key)
                except _ABSENT:
                    continue  # expired between the two: try again
                if entry.value:
                    return bytes(entry.value).decode()

    async def forget(self, app: str, call_id: str) -> None:
        """Remove a call's status: a call that could not be queued after all (its id may be created again)."""
        await self._kv.delete(subjects.call_key("s", app, call_id))

    async def set_status(self, record: CallRecord) -> None:
        await self._kv.put(subjects.call_key("s", record.app, record.call_id), encoder.encode(record))

    async def finish(self, record: CallRecord) -> bool:
        """Store a final record; False when one was already stored (the first writer won).

        A large output is stored first, in chunks named ``<app>.<call id>.<random>``, which no other writer
        touches; the record names them. A writer that loses removes its own chunks, never the winner's."""
        output = bytes(record.output)
        name = None
        if len(output) > MAX_CHUNKS * RESULT_CHUNK_BYTES:  # no reader would take it: the call fails, saying why
            record = msgspec.structs.replace(record, status="failed", output=msgspec.Raw(b"null"), error=ErrorInfo(
                code="user_error", type="ValueError", call_id=record.call_id,
                message=f"the output ({len(output)} bytes) is over the {MAX_CHUNKS * RESULT_CHUNK_BYTES} bytes a "
                        "call's record keeps; store it elsewhere (a volume, say) and return where"))
            output = b"null"
        if len(output) > MAX_INLINE_OUTPUT:
            name = f"{record.app}.{record.call_id}.{os.urandom(8).hex()}"
            pieces = [output[i:i + RESULT_CHUNK_BYTES] for i in range(0, len(output), RESULT_CHUNK_BYTES)]
            await asyncio.gather(*(self._results.put(f"{name}.{n}", piece) for n, piece in enumerate(pieces)))
            ref = encoder.encode(_ChunksRef(ember_result="chunks", name=name, chunks=len(pieces)))
            record = msgspec.structs.replace(record, output=msgspec.Raw(ref))
        try:
            await self._create_final(subjects.call_key("r", record.app, record.call_id), encoder.encode(record),
                                     record.started_at)
        except KeyWrongLastSequenceError:
            if name is not None:
                await asyncio.gather(*(self._results.delete(f"{name}.{n}") for n in range(len(pieces))))
            return False
        return True

    async def _create_final(self, key: str, value: bytes, started_at: float | None) -> None:
        """``KeyValue.create`` of a final record (only if absent), with ``STARTED_AT_HEADER`` beside it."""
        headers: dict[str, str] = {Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value: "0"}
        if started_at:
            headers[STARTED_AT_HEADER] = repr(started_at)
        try:
            await self._js.publish(f"{self._kv._pre}{key}", value, headers=headers)
        except APIError as exc:
            if exc.err_code in _WRONG_LAST_SEQUENCE:
                raise KeyWrongLastSequenceError(description=exc.description) from exc
            raise

    async def result(self, app: str, call_id: str, *, output: bool = True) -> CallRecord | None:
        """The call's final record; without ``output``, a large output stays a reference to its chunks."""
        record = _named(await self._read(subjects.call_key("r", app, call_id)), app, call_id)
        return await self._with_output(record) if output else record

    async def get(self, app: str, call_id: str) -> CallRecord | None:
        """The call's final record if it has one, else its status; None for an unknown id, or for a record that
        names another call than its key (a replica writes only its own app's keys, but any of them)."""
        return await self.result(app, call_id) or await self.status(app, call_id)

    async def status(self, app: str, call_id: str) -> CallRecord | None:
        """The call's status record alone (one read; the final record may exist beside it); None as ``get``."""
        return _named(await self._read(subjects.call_key("s", app, call_id)), app, call_id)

    async def take(self, app: str, call_id: str, function: str, attempt: int,
                   replica: str) -> tuple[CallRecord, bool]:
        """A queued call taken by ``replica``: its status record marked running (the one the submit wrote, else a
        new one), and whether it has a final record already. Read after the write: a cancel, which succeeds only on
        a queued call, is then either seen here or refused; a finished call (a late duplicate) is not run again."""
        record = await self.status(app, call_id) or new_record(call_id, app, function)
        now = time.time()
        running = msgspec.structs.replace(record, attempts=attempt, status="running", updated_at=now, started_at=now,
                                          replica=replica)
        await self.set_status(running)
        return running, await self.has_result(app, call_id)

    async def has_result(self, app: str, call_id: str) -> bool:
        return _named(await self._read(subjects.call_key("r", app, call_id)), app, call_id) is not None

    async def _with_output(self, record: CallRecord | None) -> CallRecord | None:
        ref = _chunks_ref(record) if record is not None else None
        if record is None or ref is None:
            return record
        if not ref.name.startswith(f"{record.app}.{record.call_id}."):
            return None  # chunks of another call: no record points elsewhere
        data = bytearray()
        for start in range(0, ref.chunks, READ_CHUNKS_AT_ONCE):  # a few at a time, until one is missing
            try:
                pieces = await asyncio.gather(*(self._results.get(f"{ref.name}.{n}")
                                                for n in range(start, min(start + READ_CHUNKS_AT_ONCE, ref.chunks))))
            except _ABSENT:
                return None  # a record naming chunks never written (its replica's keys: any of them) is no call's
            for piece in pieces:
                data += piece.value or b""
        return msgspec.structs.replace(record, output=msgspec.Raw(bytes(data) or b"null"))

    async def _read(self, key: str) -> CallRecord | None:
        try:
            entry = await self._kv.get(key)
        except _ABSENT:
            return None
        try:
            return _record_decoder.decode(entry.value) if entry.value else None
        except msgspec.DecodeError:  # written there by the app's own replica (its keys), or spoiled: no call's record
            return None

    async def dead_letter(self, record: CallRecord, error: ErrorInfo, body: bytes) -> int:
        """Keep a call that failed its last attempt, with its input, in the dead-letter stream; its sequence there.
        Idempotent within the stream's duplicate window (``Nats-Msg-Id: dead-<call id>``): a repeat is stored
        once, and answers the first one's sequence."""
        letter = DeadLetter(call_id=record.call_id, app=record.app, function=record.function, error=error,
                            attempts=record.attempts, dead_at=time.time(), input=msgspec.Raw(body or b"null"))
        ack = await self._js.publish(subjects.dead(record.app, record.function), encoder.encode(letter),
                                     headers={"Nats-Msg-Id": f"dead-{record.call_id}"})
        return int(ack.seq)


def _chunks_ref(record: CallRecord) -> _ChunksRef | None:
    """Where the record's output is kept when it is not in the record, or None."""
    output = bytes(record.output)
    if not output.startswith(b'{"$ember_result":'):
        return None
    try:
        ref = _ref_decoder.decode(output)
    except msgspec.DecodeError:
        return None
    return ref if ref.ember_result == "chunks" and ref.name and 0 < ref.chunks <= MAX_CHUNKS else None


def _named(record: CallRecord | None, app: str, call_id: str) -> CallRecord | None:
    """``record`` if it is the call its key names; else None. A replica writes its own app's keys, any of them, and
    the records it writes there may name another app's call: such a record is no call's (a take would write it under
    that call's key, with the control plane's rights)."""
    return record if record is not None and (record.app, record.call_id) == (app, call_id) else None


def new_record(call_id: str, app: str, function: str) -> CallRecord:
    """The status record of a queued call that has none (an event's, or one whose record expired)."""
    now = time.time()
    return CallRecord(call_id=call_id, app=app, function=function, status="queued", created_at=now, updated_at=now)


def final(record: CallRecord, status: CallStatus, *, output: bytes = b"null", error: ErrorInfo | None = None,
          attempts: int | None = None) -> CallRecord:
    return msgspec.structs.replace(record, status=status, output=msgspec.Raw(output), error=error,
                                   updated_at=time.time(),
                                   attempts=record.attempts if attempts is None else attempts)
