"""The schedule loop's calls queued together (``Calls.submit_many``) in JetStream atomic batches, on a real nats-server
with Ember's streams: each call recorded and queued once; a batch the server refuses whole (a status already
there, a ``Nats-Msg-Id`` queued before, the 50 batches in flight another client can hold open) falls back to one by
one and loses nothing; and ``publish_atomic`` itself stores all or nothing."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from support.nats_cluster import NatsCluster
from support.natsconn import connect

from ember._loop import run as run_loop
from ember.wire import CallRecord, SpawnReply, subjects
from ember.wire.atomic import BatchRefused, allow_atomic, publish_atomic
from ember.wire.callstore import final
from ember.wire.jetstream import ensure_buckets, kv_stream
from ember_platform.calls.durable import Calls, Submission

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
APP = "batched"
STREAMS = (kv_stream(subjects.CALLS_BUCKET), subjects.CALLS_STREAM)


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory):
    with NatsCluster(tmp_path_factory.mktemp("nats"), size=1) as cluster:
        yield cluster.url


def _ticks(n: int) -> list[Submission]:
    run = uuid.uuid4().hex[:8]
    return [Submission(APP, f"f{run}-{i}", f"{APP}_{run}{i:024x}", f"{APP}.f{run}-{i}.1") for i in range(n)]


async def _calls(url: str) -> tuple[Any, Calls]:
    nc = await connect(url)
    stores = await ensure_buckets(nc.jetstream())
    for stream in STREAMS:  # as the control plane does at its start
        assert await allow_atomic(nc.jetstream(), stream)
    return nc, Calls(nc, stores, 30.0)


async def _queued(js: Any, ticks: list[Submission]) -> list[int]:
    """How many messages the queue holds for each tick's function."""
    every = subjects.calls(APP, "f").rsplit(".", 1)[0] + ".*"
    info = await js.stream_info(subjects.CALLS_STREAM, subjects_filter=every)
    held = info.state.subjects or {}
    return [held.get(subjects.calls(APP, tick.function), 0) for tick in ticks]


async def _submit(url: str, ticks: list[Submission], before: int = 0, open_batches: tuple[str, ...] = (),
                  ) -> tuple[list[Any], list[str], list[int]]:
    """``submit_many(ticks)``, the first ``before`` of them submitted (and the first of those finished) beforehand;
    50 batches left open first on each stream of ``open_batches``. (replies, statuses, messages per function)"""
    nc, calls = await _calls(url)
    try:
        for tick in ticks[:before]:
            await calls.submit(tick.app, tick.function, tick.body, key=None, deadline=float("inf"),
                               call_id=tick.call_id, msg_id=tick.msg_id)
        if before:
            record = await calls.store.status(APP, ticks[0].call_id)
            assert record is not None
            await calls.store.finish(final(record, "succeeded"))
        for stream in open_batches:
            subject = subjects.calls(APP, "open") if stream == subjects.CALLS_STREAM else \
                f"$KV.{subjects.CALLS_BUCKET}.s.{APP}.open"
            for _ in range(50):
                await nc.request(subject, b"{}", timeout=5,
                                 headers={"Nats-Batch-Id": f"open-{uuid.uuid4().hex}", "Nats-Batch-Sequence": "1"})
        replies = await calls.submit_many(ticks)
        statuses: list[str] = []
        for tick in ticks:
            record = await calls.store.get(APP, tick.call_id)
            statuses.append(record.status if record else "")
        return list(replies), statuses, await _queued(nc.jetstream(), ticks)
    finally:
        await nc.close()


def test_a_tick_of_many_is_recorded_and_queued_once_each(nats_url):
    ticks = _ticks(1200)  # several batches of each kind
    replies, statuses, queued = run_loop(_submit(nats_url, ticks))
    assert all(isinstance(r, SpawnReply) and r.created and r.status == "queued" for r in replies)
    assert [r.call_id for r in replies] == [t.call_id for t in ticks]
    assert set(statuses) == {"queued"} and queued == [1] * len(ticks)


def test_a_batch_holding_calls_queued_before_goes_one_by_one_and_queues_none_twice(nats_url):
    ticks = _ticks(20)
    replies, statuses, queued = run_loop(_submit(nats_url, ticks, before=3))
    assert isinstance(replies[0], SpawnReply) and (replies[0].status, replies[0].created) == ("succeeded", False)
    assert all(isinstance(r, SpawnReply) and (r.status, r.created) == ("queued", False) for r in replies[1:3])
    assert all(isinstance(r, SpawnReply) and (r.status, r.created) == ("queued", True) for r in replies[3:])
    assert statuses == ["succeeded"] + ["queued"] * 19
    assert queued == [1] * 20  # the three queued before: deduplicated by their Nats-Msg-Id


async def _refused(url: str) -> tuple[int, int, int]:
    nc, calls = await _calls(url)
    try:
        js = nc.jetstream()
        records = [CallRecord(call_id=t.call_id, app=APP, function=t.function, status="queued", created_at=0.0,
                              updated_at=0.0) for t in _ticks(3)]
        await calls.store.create_status(records[1])
        with pytest.raises(BatchRefused) as refused:
            await publish_atomic(js, [calls.store.create_status_message(r) for r in records])
        stored = [await calls.store.status(APP, r.call_id) is not None for r in records]
        last = await publish_atomic(js, [calls.store.create_status_message(r) for r in (records[0], records[2])])
        entry = await calls.store._kv.get(subjects.call_key("s", APP, records[2].call_id))
        return refused.value.err_code, sum(stored), last - (entry.revision or 0)
    finally:
        await nc.close()


def test_an_atomic_batch_is_stored_whole_or_not_at_all(nats_url):
    err_code, stored, last_minus_revision = run_loop(_refused(nats_url))
    assert err_code == 10071  # wrong last sequence: the one status already there
    assert stored == 1  # that one alone: none of the batch
    assert last_minus_revision == 0  # the sequence returned is the last message's


def test_a_batch_too_large_is_refused_before_anything_is_sent():
    with pytest.raises(ValueError, match="1 to 1000"):
        asyncio.run(publish_atomic(None, [("s", b"", {})] * 1001))


@pytest.mark.parametrize("held", [(subjects.CALLS_STREAM,), STREAMS], ids=["the-queue", "both-streams"])
def test_batches_held_open_by_another_client_slow_the_ticks_but_lose_none(nats_url, held):  # last: open for 10 s
    ticks = _ticks(30)
    replies, statuses, queued = run_loop(_submit(nats_url, ticks, open_batches=held))
    assert all(isinstance(r, SpawnReply) and (r.status, r.created) == ("queued", True) for r in replies)
    assert set(statuses) == {"queued"} and queued == [1] * 30
