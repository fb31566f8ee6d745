"""The records store's first-writer-wins rule holds for large outputs too, and a submit whose publish fails
leaves no record behind and answers 503 (in-memory stand-ins for the KV bucket, object store and JetStream)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from ember._errors import UnavailableError
from ember.wire import CallRecord
from ember.wire.callstore import MAX_INLINE_OUTPUT, CallStore, final
from ember_platform.calls.durable import Calls


class FakeKV:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def create(self, key: str, value: bytes) -> int:
        if key in self.data:
            raise KeyWrongLastSequenceError()
        self.data[key] = value
        return len(self.data)

    async def put(self, key: str, value: bytes) -> int:
        self.data[key] = value
        return len(self.data)

    async def get(self, key: str) -> Any:
        if key not in self.data:
            raise KeyNotFoundError()
        return SimpleNamespace(value=self.data[key])

    async def delete(self, key: str) -> bool:
        self.data.pop(key, None)
        return True

    async def purge(self, key: str) -> bool:
        return await self.delete(key)


class FakeObjects:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def put(self, name: str, data: bytes) -> None:
        self.data[name] = data

    async def get(self, name: str) -> Any:
        if name not in self.data:
            raise NotFoundError()
        return SimpleNamespace(data=self.data[name])

    async def delete(self, name: str) -> None:
        self.data.pop(name, None)


def _record(call_id: str = "c1") -> CallRecord:
    now = time.time()
    return CallRecord(call_id=call_id, app="a", function="f", status="running", created_at=now, updated_at=now)


def _store() -> tuple[CallStore, FakeKV, FakeObjects]:
    kv, objects = FakeKV(), FakeObjects()
    return CallStore(None, SimpleNamespace(calls=kv, results=objects)), kv, objects  # type: ignore[arg-type]


def _big(char: str) -> bytes:
    return msgspec.json.encode(char * (MAX_INLINE_OUTPUT + 10))


def test_a_late_duplicate_never_overwrites_the_winners_large_output():
    store, _, objects = _store()

    async def go() -> CallRecord | None:
        assert await store.finish(final(_record(), "succeeded", output=_big("a")))
        assert not await store.finish(final(_record(), "succeeded", output=_big("b")))  # the late duplicate
        return await store.result("c1")

    record = asyncio.run(go())
    assert record is not None and bytes(record.output) == _big("a")
    assert list(objects.data.values()) == [_big("a")]  # the loser removed its own object, and only that


def test_a_record_of_the_old_form_still_finds_its_output_under_the_call_id():
    store, kv, objects = _store()
    old = final(_record(), "succeeded", output=b'{"$ember_result":"object"}')
    kv.data["r.c1"] = msgspec.json.encode(old)
    objects.data["c1"] = _big("z")
    record = asyncio.run(store.result("c1"))
    assert record is not None and bytes(record.output) == _big("z")


def test_a_small_output_stays_in_the_record():
    store, _, objects = _store()

    async def go() -> CallRecord | None:
        assert await store.finish(final(_record(), "succeeded", output=b'"small"'))
        return await store.result("c1")

    record = asyncio.run(go())
    assert record is not None and bytes(record.output) == b'"small"' and not objects.data


class FailingJS:
    def __init__(self) -> None:
        self.published = 0

    async def publish(self, *args: Any, **kwargs: Any) -> None:
        self.published += 1
        raise NatsTimeoutError()


def _calls() -> tuple[Calls, FakeKV]:
    kv = FakeKV()
    calls = Calls.__new__(Calls)
    calls._js = FailingJS()
    calls.store = CallStore(calls._js, SimpleNamespace(calls=kv, results=FakeObjects()))  # type: ignore[arg-type]
    calls._ack_wait_s = 30.0
    return calls, kv


@pytest.mark.parametrize("key", [None, "my-key"])
def test_a_submit_whose_publish_fails_leaves_no_queued_record_and_is_a_503(key):
    calls, kv = _calls()
    with pytest.raises(UnavailableError) as caught:
        asyncio.run(calls.submit("a", "f", b"1", key=key, deadline=float("inf")))
    assert caught.value.http_status == 503 and caught.value.retry_after_s
    assert not [k for k in kv.data if k.startswith("s.")]  # no "queued" record that would never run
