"""Each app's share of the calls' queue (``calls.shares``), on a real nats-server: an app's calls past its share are
refused while another app's go on; a call some other control plane queued counts as the app's own calls, never as
other apps' (an app of small calls was refused because another held large ones, and an app of large calls let past
because others' were small); the bytes this control plane counts bound what the queue holds whichever calls ran
(its large calls still waiting count whole after a hundred small ones ran: a first-in-first-out ledger, or a mean,
would have let the app past), also once the app has been idle; a schedule's ticks past the share get the 429 in
their replies; and the share is at most a quarter of what the stream really holds."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.nats_cluster import NatsCluster
from support.natsconn import connect

from ember import _loop as ember_loop
from ember._errors import OverloadedError
from ember.wire import subjects
from ember.wire.jetstream import StorageLimits, ensure_buckets
from ember_platform.calls import shares
from ember_platform.calls.durable import Calls, Submission
from ember_platform.calls.shares import Sizes, rounded

pytestmark = pytest.mark.timeout(60)
KiB = 1 << 10


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory):
    with NatsCluster(tmp_path_factory.mktemp("nats"), size=1) as cluster:
        yield cluster.url


@pytest.fixture(autouse=True)
def fresh_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shares, "STALE_S", 0.0)  # every admission waits for a read of the app's queues: exact here
    monkeypatch.setattr(shares, "READ_EVERY_S", 0.0)


@contextlib.asynccontextmanager
async def _planes(url: str, n: int, **limits: int) -> AsyncIterator[tuple[list[Any], list[Calls]]]:
    """``n`` control planes' ``Calls``, each on its own connection, with these limits; the queue emptied first, and
    the consumers an earlier test made gone (a work queue takes one consumer per subject)."""
    ncs = [await connect(url) for _ in range(n)]
    try:
        js = ncs[0].jetstream()
        stores = await ensure_buckets(js)
        await js.purge_stream(subjects.CALLS_STREAM)
        for consumer in await js.consumers_info(subjects.CALLS_STREAM):
            await js.delete_consumer(subjects.CALLS_STREAM, consumer.name)
        yield ncs, [Calls(nc, stores, 30.0, lambda _: None, limits=StorageLimits(**limits)) for nc in ncs]
    finally:
        for nc in ncs:
            await nc.close()


async def _submit(calls: Calls, app: str, size: int) -> str:
    try:
        await calls.submit(app, "f", b"x" * size, key=None, deadline=math.inf)
        return "queued"
    except OverloadedError as exc:
        return exc.message


def test_rounded_sizes_are_at_most_an_eighth_over():
    for size in [1, 2, 15, 16, 17, 1000, 4095, 4097, 300 * KiB + 7, 4 << 20, (4 << 20) + 1]:
        assert size <= rounded(size) <= size * 1.125


def _stored(*sizes: int) -> Sizes:
    ledger = Sizes()
    for seq, size in enumerate(sizes, 1):
        ledger.add(size)
        ledger.stored(size, seq)
    return ledger


def test_the_largest_calls_are_the_ones_kept():
    sizes = _stored(64, 4096, 256, 65536, 1024)
    assert sizes.largest(2) == 65536 + 4096
    sizes.ran(floor=0, delivered=0, pending=0, held=2)  # the queue holds two: whichever, these two bound them
    assert (sizes.n, sizes.total) == (2, 65536 + 4096)


def test_calls_the_consumer_took_leave_but_the_unacknowledged_ones():
    sizes = _stored(64, 4096, 256, 65536, 1024, 512)
    # 1 and 2 acked (the floor); of 3 to 5, delivered, one is unacknowledged (a long call, or a retry: the floor
    # waits for it), the largest of them kept; 6 still waits
    sizes.ran(floor=2, delivered=5, pending=1, held=100)
    assert (sizes.n, sizes.total) == (2, 65536 + 512)
    sizes.ran(floor=6, delivered=6, pending=0, held=100)
    assert (sizes.n, sizes.total) == (0, 0)


def test_a_call_being_published_is_counted_until_settled():
    sizes = _stored(4096)
    sizes.add(1024)  # admitted, its publish under way: no read trims it
    sizes.ran(floor=1, delivered=1, pending=0, held=0)
    assert (sizes.n, sizes.total) == (1, 1024)
    sizes.stored(1024, 7)
    sizes.add(1024)
    sizes.stored(1024, 7)  # a submit repeated, its message deduplicated: the same sequence acked again
    assert (sizes.n, sizes.total) == (1, 1024)
    sizes.add(2048)
    sizes.remove(2048)  # not stored: its publish failed
    sizes.remove(2048)  # nor anything more
    assert (sizes.n, sizes.total) == (1, 1024)


def test_an_apps_calls_past_its_share_are_refused_and_another_apps_are_not(nats_url):
    async def scenario() -> tuple[list[str], list[str]]:
        async with _planes(nats_url, 1, calls_stream_max_msgs_per_app=3) as (_, [calls]):
            mine = [await _submit(calls, "hog", 10) for _ in range(4)]
            theirs = [await _submit(calls, "meek", 10) for _ in range(3)]
            return mine, theirs

    mine, theirs = ember_loop.run(scenario())
    assert mine[:3] == ["queued"] * 3
    assert "holds 3 queued calls" in mine[3] and "EMBER_CALLS_STREAM_MAX_MSGS_PER_APP 3" in mine[3]
    assert theirs == ["queued"] * 3


def test_calls_another_control_plane_queued_count_as_the_apps_own(nats_url):
    async def scenario() -> list[str]:
        async with _planes(nats_url, 2, calls_stream_max_bytes_per_app=1 << 20) as (_, [first, second]):
            said = [await _submit(first, "meek", KiB) for _ in range(200)]  # 250 KiB with their messages
            said += [await _submit(first, "hog", 300 * KiB) for _ in range(3)]  # the stream's mean: 5 KiB
            said.append(await _submit(second, "meek", KiB))  # it never saw meek's 200: as small as this one
            said.append(await _submit(second, "hog", 300 * KiB))  # nor hog's 3: as large as this one
            return said

    said = ember_loop.run(scenario())
    assert said[:204] == ["queued"] * 204
    assert "EMBER_CALLS_STREAM_MAX_BYTES_PER_APP 1.0 MiB" in said[204], said[204]


def test_an_app_holding_calls_is_not_forgotten_when_idle(nats_url, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(shares, "FORGET_S", 0.0)  # every read sweeps, and every app is idle long enough

    async def scenario() -> list[str]:
        async with _planes(nats_url, 1, calls_stream_max_bytes_per_app=1 << 20) as (_, [calls]):
            said = [await _submit(calls, "hog", 300 * KiB) for _ in range(3)]
            said.append(await _submit(calls, "meek", 10))  # its read sweeps the idle apps
            said.append(await _submit(calls, "hog", 1))  # forgotten, hog's 3 would count as this one
            said.append(await _submit(calls, "hog", 300 * KiB))
            return said

    said = ember_loop.run(scenario())
    assert said[:5] == ["queued"] * 5
    assert "EMBER_CALLS_STREAM_MAX_BYTES_PER_APP" in said[5], said[5]


def test_a_schedules_ticks_past_the_share_get_the_429_in_their_replies(nats_url):
    async def scenario() -> list[object]:
        async with _planes(nats_url, 1, calls_stream_max_msgs_per_app=3) as (_, [calls]):
            ticks = [Submission(app, "f", f"{app}_{i:032x}", f"tick-{app}-{i}") for app in ("hog", "meek")
                     for i in range(5 if app == "hog" else 2)]
            replies = await calls.submit_many(ticks)
            state = calls.shares._apps["hog"].queues[subjects.calls("hog", "f")]
            return [*replies, (state.calls, state.publishing)]

    *replies, (hog_calls, publishing) = ember_loop.run(scenario())
    assert [type(r).__name__ for r in replies] == ["SpawnReply"] * 3 + ["OverloadedError"] * 2 + ["SpawnReply"] * 2
    assert (hog_calls, publishing) == (3, 0)  # every admitted tick counted once, none left publishing


def test_the_share_is_at_most_a_quarter_of_what_the_stream_holds(nats_url):
    async def scenario() -> list[str]:
        async with _planes(nats_url, 1) as (ncs, [calls]):  # the default share: 256 MiB
            js = ncs[0].jetstream()
            config = (await js.stream_info(subjects.CALLS_STREAM)).config
            try:
                await js.update_stream(config.evolve(max_bytes=2 << 20))  # as reserving() leaves it on a small disk
                return [await _submit(calls, "hog", 300 * KiB) for _ in range(2)]
            finally:
                await js.update_stream(config)

    said = ember_loop.run(scenario())
    assert said[0] == "queued"
    assert "EMBER_CALLS_STREAM_MAX_BYTES_PER_APP 0.5 MiB" in said[1], said[1]


def test_large_calls_still_waiting_count_whole_after_small_ones_ran(nats_url):
    async def scenario() -> list[str]:
        async with _planes(nats_url, 1, calls_stream_max_bytes_per_app=1 << 20) as (ncs, [calls]):
            js = ncs[0].jetstream()
            said = [await _submit(calls, "hog", 400 * KiB)]
            said += [await _submit(calls, "hog", KiB) for _ in range(100)]
            worker = await js.pull_subscribe(subjects.calls("hog", "f"), "hog-worker", stream=subjects.CALLS_STREAM)
            ran = 0
            while ran < 100:  # the small ones run and leave the queue; the large one waits on
                for msg in await worker.fetch(10, timeout=5):
                    if len(msg.data) < 400 * KiB:
                        await msg.ack()
                        ran += 1
                    else:
                        await msg.nak(delay=30)
            said += [await _submit(calls, "hog", 400 * KiB) for _ in range(2)]
            await js.purge_stream(subjects.CALLS_STREAM)  # every call ran: the share is free again
            said.append(await _submit(calls, "hog", 400 * KiB))
            return said

    said = ember_loop.run(scenario())
    assert said[:102] == ["queued"] * 102  # 400 KiB + 100 KiB + 400 KiB, with their messages
    assert "EMBER_CALLS_STREAM_MAX_BYTES_PER_APP" in said[102]  # a third 400 KiB would pass the 1 MiB
    assert said[103] == "queued"


def test_no_share_reads_nothing(nats_url):
    async def scenario() -> tuple[str, int]:
        no_share = {"calls_stream_max_bytes_per_app": -1, "calls_stream_max_msgs_per_app": -1}
        async with _planes(nats_url, 1, **no_share) as (_, [calls]):
            said = await _submit(calls, "hog", 10)
            return said, len(calls.shares._apps)

    assert ember_loop.run(scenario()) == ("queued", 0)


def test_a_read_in_flight_is_shared(nats_url, monkeypatch: pytest.MonkeyPatch):
    async def scenario() -> tuple[list[str], int]:
        async with _planes(nats_url, 1, calls_stream_max_msgs_per_app=1000) as (_, [calls]):
            reads = 0
            real = calls.shares._js.stream_info

            async def counted(*args: Any, **kwargs: Any) -> Any:
                nonlocal reads
                reads += 1
                await asyncio.sleep(0.05)
                return await real(*args, **kwargs)

            monkeypatch.setattr(calls.shares, "_js", type("JS", (), {"stream_info": staticmethod(counted)})())
            said = await asyncio.gather(*(_submit(calls, "hog", 10) for _ in range(20)))
            return list(said), reads

    said, reads = ember_loop.run(scenario())
    assert said == ["queued"] * 20 and reads == 1


def test_calls_that_ran_leave_the_ledger_at_their_queues_ack_floor(nats_url):
    """Sizes of calls that ran long ago no longer price the calls another control plane queued: an app of small
    calls was refused after its large ones ran, as long as its backlog stayed as long as their count."""
    async def scenario() -> list[str]:
        async with _planes(nats_url, 2, calls_stream_max_bytes_per_app=1 << 20) as (ncs, [first, second]):
            js = ncs[0].jetstream()
            said = [await _submit(first, "hog", 90 * KiB) for _ in range(10)]
            worker = await js.pull_subscribe(subjects.calls("hog", "f"), subjects.calls_consumer("hog", "f"),
                                             stream=subjects.CALLS_STREAM)  # the function's own consumer
            ran = 0
            while ran < 10:  # they run: the queue's ack floor passes them
                for msg in await worker.fetch(10, timeout=5):
                    await msg.ack_sync()
                    ran += 1
            said += [await _submit(second, "hog", 10) for _ in range(40)]  # a backlog the first never saw
            said.append(await _submit(first, "hog", 10))
            return said

    assert ember_loop.run(scenario()) == ["queued"] * 51


def test_a_ticket_of_a_deleted_app_settles_nothing_in_the_apps_next_ledger(nats_url):
    async def scenario() -> tuple[int, int]:
        async with _planes(nats_url, 1, calls_stream_max_msgs_per_app=10) as (_, [calls]):
            old = await calls.shares.admit("hog", "f", None, 10)  # its publish under way when the app is deleted
            calls.shares.forget("hog")
            await calls.shares.admit("hog", "f", None, 10)  # the app pushed again, spawning
            calls.shares.queued(old, 1)
            calls.shares.release(old)
            queue = calls.shares._apps["hog"].queues[subjects.calls("hog", "f")]
            return queue.publishing, queue.added

    assert ember_loop.run(scenario()) == (1, 0)
