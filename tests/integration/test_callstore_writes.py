"""The records store's first-writer-wins rule holds for large outputs too, and a submit that cannot be queued
leaves no record behind and answers 503; against the session's real nats-server and its buckets."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import pytest
from support.natsconn import all_keys
from support.natsconn import connect as admin_connect

from ember._errors import UnavailableError
from ember.wire import CallRecord
from ember.wire.callstore import MAX_INLINE_OUTPUT, CallStore, final, new_call_id
from ember.wire.jetstream import Stores, ensure_buckets
from ember_platform.calls.durable import Calls

pytestmark = pytest.mark.integration
T = TypeVar("T")


def with_store(url: str, body: Callable[[Any, Stores, CallStore], Awaitable[T]]) -> T:
    async def go() -> T:
        nc = await admin_connect(url)
        try:
            stores = await ensure_buckets(nc.jetstream())
            return await body(nc, stores, CallStore(nc.jetstream(), stores.calls, stores.results))
        finally:
            await nc.close()

    return asyncio.run(go())


def _record(call_id: str) -> CallRecord:
    now = time.time()
    return CallRecord(call_id=call_id, app="a", function="f", status="running", created_at=now, updated_at=now)


def _big(char: str) -> bytes:
    return msgspec.json.encode(char * (MAX_INLINE_OUTPUT + 10))


async def _objects(stores: Stores, call_id: str) -> list[str]:
    """The writers whose chunks of ``call_id``'s output are kept (``<app>.<call id>.<writer>.<n>``; exactly: the
    session's bucket holds every test's outputs, and a loser's chunks are deleted keys)."""
    return sorted({k.split(".")[2] for k in await all_keys(stores.results, f"a.{call_id}.>")})


def test_a_late_duplicate_never_overwrites_the_winners_large_output(platform):
    call_id = uuid.uuid4().hex

    async def body(_nc: Any, stores: Stores, store: CallStore) -> tuple[bytes, list[str]]:
        assert await store.finish(final(_record(call_id), "succeeded", output=_big("a")))
        assert not await store.finish(final(_record(call_id), "succeeded", output=_big("b")))  # the late duplicate
        record = await store.result("a", call_id)
        assert record is not None
        return bytes(record.output), await _objects(stores, call_id)

    output, objects = with_store(platform.nats_url, body)
    assert output == _big("a")
    assert len(objects) == 1  # the loser removed its own object, and only that


def test_two_writers_racing_leave_one_record_and_its_own_bytes(platform):
    call_id = uuid.uuid4().hex

    async def body(_nc: Any, stores: Stores, store: CallStore) -> tuple[list[bool], bytes, list[str]]:
        won = await asyncio.gather(*(store.finish(final(_record(call_id), "succeeded", output=_big(c)))
                                     for c in "xyz"))
        record = await store.result("a", call_id)
        assert record is not None
        return list(won), bytes(record.output), await _objects(stores, call_id)

    won, output, objects = with_store(platform.nats_url, body)
    assert won.count(True) == 1
    assert output == _big("xyz"[won.index(True)])
    assert len(objects) == 1


def test_a_record_that_names_another_call_than_its_key_is_no_record(platform):
    """A replica may write any key of its own app, with any body: a body naming another app (or call) than its key is
    never taken for that app's call."""
    call_id = new_call_id("a")

    async def body(_nc: Any, stores: Stores, store: CallStore) -> tuple[Any, Any]:
        forged = msgspec.structs.replace(final(_record(call_id), "succeeded"), app="victim")
        await stores.calls.create(f"r.a.{call_id}", msgspec.json.encode(forged))  # key says a, body says victim
        return await store.get("a", call_id), await store.get("victim", call_id)

    assert with_store(platform.nats_url, body) == (None, None)


@pytest.mark.parametrize("key", [None, "my-key"])
def test_a_submit_that_cannot_be_queued_leaves_no_record_and_is_a_503(platform, key):
    """The message is refused by the server (a header NATS rejects: an expected stream that does not exist),
    as a full queue or an unreachable server would refuse it."""
    app = f"nq{uuid.uuid4().hex[:8]}"

    async def body(nc: Any, stores: Stores, store: CallStore) -> tuple[UnavailableError, list[str]]:
        calls = Calls(nc, stores, 30.0)
        refusing = _Refusing(nc.jetstream())
        calls._js = refusing  # the one stand-in here: the publish that the server refuses is the real one
        with pytest.raises(UnavailableError) as caught:
            await calls.submit(app, "f", b"1", key=key, deadline=float("inf"))
        assert refusing.refused == 1
        return caught.value, await _keys(stores, app)

    error, keys = with_store(platform.nats_url, body)
    assert error.http_status == 503 and error.retry_after_s
    # No record of the call; an Idempotency-Key keeps the id it maps to, so that a retry (whose message JetStream
    # may have stored after all) gets the same id and is deduplicated. Only this app's keys: the session's other
    # apps (a scheduled one ticks) write theirs meanwhile.
    assert [k for k in keys if not k.startswith("k.")] == []
    assert len(keys) == (0 if key is None else 1)


class _Refusing:
    """The real JetStream context, publishing with a header that makes nats-server refuse the message."""

    def __init__(self, js: Any) -> None:
        self._js = js
        self.refused = 0

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> Any:
        try:
            return await self._js.publish(subject, payload, headers={**headers, "Nats-Expected-Stream": "NO_SUCH"})
        except Exception:
            self.refused += 1
            raise


async def _keys(stores: Stores, app: str) -> list[str]:
    """The keys ``app`` holds in ``ember_calls`` (``<kind>.<app>.<id>``; a removed status is not one)."""
    return sorted(await all_keys(stores.calls, f"*.{app}.>"))


def test_a_record_claiming_chunks_never_written_is_no_calls_and_costs_a_few_reads(platform):
    """A replica writes its own app's records, any of them: one whose output claimed a million chunks made the
    control plane that read it (a relayed read, GET /v1/calls) send a million reads at once, and fail."""
    claims = {uuid.uuid4().hex: n for n in (3, 4000, 1 << 20)}

    async def body(_nc: Any, stores: Stores, store: CallStore) -> list[CallRecord | None]:
        found = []
        for call_id, chunks in claims.items():
            name = f"a.{call_id}.forged"
            await stores.results.put(f"{name}.0", b'"only the first"')
            ref = msgspec.json.encode({"$ember_result": "chunks", "name": name, "chunks": chunks})
            await stores.calls.put(f"r.a.{call_id}", msgspec.json.encode(
                final(_record(call_id), "succeeded", output=ref)))
            found.append(await asyncio.wait_for(store.result("a", call_id), 30))
        return found

    results = with_store(platform.nats_url, body)
    assert results[:2] == [None, None]  # chunks missing: no call's output (KeyNotFoundError before)
    assert results[2] is not None and bytes(results[2].output).startswith(b'{"$ember_result"')  # past the most any
    #                                                          record may claim: its output is what it says, unread


def test_an_output_larger_than_a_record_keeps_fails_its_call_saying_so(platform, monkeypatch):
    monkeypatch.setattr("ember.wire.callstore.MAX_CHUNKS", 2)  # 512 KiB, not 1 GiB: the rule, at a test's size
    call_id = uuid.uuid4().hex

    async def body(_nc: Any, _stores: Stores, store: CallStore) -> CallRecord | None:
        assert await store.finish(final(_record(call_id), "succeeded", output=_big("c") * 3))
        return await store.result("a", call_id)

    record = with_store(platform.nats_url, body)
    assert record is not None and record.status == "failed" and record.error is not None
    assert "over the 524288 bytes" in record.error.message and bytes(record.output) == b"null"
