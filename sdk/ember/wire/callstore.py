"""Asynchronous calls' state in JetStream, shared by the platform and the replicas.

Each call has two keys in the ``ember_calls`` KV bucket: ``s.<id>``, its status while it waits or runs,
and ``r.<id>``, its final record. The final record is written with ``create`` (only if absent), so the
first writer wins: a late duplicate of a redelivered call, or a cancel racing a finish, can never
overwrite or duplicate a result. Outputs too large for a KV entry go to the ``ember_results`` object
store under a name of their own writer's (``<call id>.<random>``), written before the record that points
at it: the winner's record always points at the winner's bytes, and a writer that lost removes its object.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import msgspec
from nats.js.errors import APIError as JsAPIError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError, NotFoundError

from ember.wire import CallRecord, CallStatus, DeadLetter, ErrorInfo, encoder, subjects
from ember.wire.jetstream import Stores

MAX_INLINE_OUTPUT = 256 * 1024
_record_decoder = msgspec.json.Decoder(CallRecord)


class _ObjectRef(msgspec.Struct, frozen=True):
    """The output of a record whose output is in the object store."""

    ember_result: str = msgspec.field(name="$ember_result")
    name: str = ""


_ref_decoder = msgspec.json.Decoder(_ObjectRef)


class CallStore:
    def __init__(self, js: Any, stores: Stores) -> None:
        self._js = js
        self._kv = stores.calls
        self._results = stores.results

    async def create_status(self, record: CallRecord) -> CallRecord | None:
        """Record a new call as queued; returns the existing record instead when the id is taken."""
        try:
            await self._kv.create(f"s.{record.call_id}", encoder.encode(record))
            return None
        except KeyWrongLastSequenceError:
            return await self.get(record.call_id)

    async def call_id_for_key(self, key_hash: str, call_id: str) -> str:
        """The call id an idempotency key maps to (``k.<key hash>``): ``call_id`` when this writer stored the mapping
        first, else the first writer's. The mapping expires with the records (the bucket's TTL)."""
        while True:
            try:
                await self._kv.create(f"k.{key_hash}", call_id.encode())
                return call_id
            except KeyWrongLastSequenceError:
                try:
                    entry = await self._kv.get(f"k.{key_hash}")
                except (KeyNotFoundError, NotFoundError, NoKeysError):
                    continue  # expired between the two: try again
                if entry.value:
                    return bytes(entry.value).decode()

    async def forget(self, call_id: str) -> None:
        """Remove a call's status: a call that could not be queued after all (its id may be created again)."""
        await self._kv.delete(f"s.{call_id}")

    async def set_status(self, record: CallRecord) -> None:
        await self._kv.put(f"s.{record.call_id}", encoder.encode(record))

    async def finish(self, record: CallRecord) -> bool:
        """Store a final record; False when one was already stored (the first writer won).

        A large output is stored first, as ``<call id>.<random>``, an object no other writer touches; the
        record names it. A writer that loses removes its own object, never the winner's."""
        output = bytes(record.output)
        name = None
        if len(output) > MAX_INLINE_OUTPUT:
            name = f"{record.call_id}.{os.urandom(8).hex()}"
            await self._results.put(name, output)
            ref = encoder.encode(_ObjectRef(ember_result="object", name=name))
            record = msgspec.structs.replace(record, output=msgspec.Raw(ref))
        try:
            await self._kv.create(f"r.{record.call_id}", encoder.encode(record))
        except KeyWrongLastSequenceError:
            if name is not None:
                await self._results.delete(name)
            return False
        return True

    async def result(self, call_id: str) -> CallRecord | None:
        record = await self._read(f"r.{call_id}")
        name = _object_name(record) if record is not None else None
        if record is not None and name is not None:
            data = (await self._results.get(name)).data or b"null"
            record = msgspec.structs.replace(record, output=msgspec.Raw(data))
        return record

    async def get(self, call_id: str) -> CallRecord | None:
        """The call's final record if it has one, else its status; None for an unknown id."""
        return await self.result(call_id) or await self._read(f"s.{call_id}")

    async def status(self, call_id: str) -> CallRecord | None:
        """The call's status record alone (one read; the final record may exist beside it)."""
        return await self._read(f"s.{call_id}")

    async def has_result(self, call_id: str) -> bool:
        return await self._read(f"r.{call_id}") is not None

    async def _read(self, key: str) -> CallRecord | None:
        try:
            entry = await self._kv.get(key)
        except (KeyNotFoundError, NotFoundError, NoKeysError):
            return None
        return _record_decoder.decode(entry.value) if entry.value else None

    async def dead_letter(self, record: CallRecord, error: ErrorInfo, body: bytes) -> int:
        """Keep a call that failed its last attempt, with its input, in the dead-letter stream; its sequence there.
        Idempotent within the stream's duplicate window (``Nats-Msg-Id: dead-<call id>``): a repeat is stored
        once, and answers the first one's sequence."""
        letter = DeadLetter(call_id=record.call_id, app=record.app, function=record.function, error=error,
                            attempts=record.attempts, dead_at=time.time(), input=msgspec.Raw(body or b"null"))
        ack = await self._js.publish(subjects.dead(record.app, record.function), encoder.encode(letter),
                                     headers={"Nats-Msg-Id": f"dead-{record.call_id}"})
        return int(ack.seq)

    async def withdraw_letter(self, call_id: str, seq: int) -> None:
        """Remove the dead letter at ``seq``, published by a writer that then lost the final record, unless the
        record that won is a failure too (then the letter is that failure's)."""
        winner = await self._read(f"r.{call_id}")
        if winner is not None and winner.status == "failed":
            return
        with contextlib.suppress(JsAPIError):  # gone already
            await self._js.delete_msg(subjects.DEAD_STREAM, seq)


def _object_name(record: CallRecord) -> str | None:
    """The object holding the record's output, or None when the output is in the record. A record written
    before objects had names of their own (``{"$ember_result":"object"}``) names ``<call id>``."""
    output = bytes(record.output)
    if not output.startswith(b'{"$ember_result":'):
        return None
    try:
        ref = _ref_decoder.decode(output)
    except msgspec.DecodeError:
        return None
    if ref.ember_result != "object":
        return None
    return ref.name or record.call_id


def final(record: CallRecord, status: CallStatus, *, output: bytes = b"null", error: ErrorInfo | None = None,
          attempts: int | None = None) -> CallRecord:
    return msgspec.structs.replace(record, status=status, output=msgspec.Raw(output), error=error,
                                   updated_at=time.time(),
                                   attempts=record.attempts if attempts is None else attempts)
