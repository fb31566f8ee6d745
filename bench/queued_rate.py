"""bench/per_call.py's queued cells: calls/s from the first submit to the last stored result, with 10,000 queued.

``spawn_rate``: ``POST /v1/percall/Batched.predict/spawn`` (bench/queues.py's submitter and reader).
``events_rate``: JetStream publishes to ``events.percall.vectors``, the subject ``on_vectors`` (the same batched MLP) is
bound to, by ``concurrency`` publishers each waiting for its ack (as the spawn submitters wait for their 202); the
results arrive on ``events.percall.predictions``, where a replica publishes each one just before it stores the call's
final record. Both cells first run 100 calls as a warm-up, and 20 lone calls one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

APP = "percall"
EVENTS_SUBJECT, RESULTS_SUBJECT = "events.percall.vectors", "events.percall.predictions"
GOAL = "goal: 1,500 calls/s with 10,000 queued"


async def spawn_rate(url: str, bodies: list[bytes], n: int, submit_concurrency: int, read_while: bool = False) -> str:
    import queues

    path = f"/v1/{APP}/Batched.predict/spawn"
    ids = await queues.submit_all(url, path, bodies, min(100, n), submit_concurrency, None)  # warm-up
    await queues.read_all(url, ids, 8, time.time() + 120)
    lone = []
    for _ in range(20):  # one at a time: submit, wait for its result
        one = await queues.submit_all(url, path, bodies, 1, 1, None)
        records, _ = await queues.read_all(url, one, 1, time.time() + 60)
        lone += [1000 * (r["updated_at"] - r["created_at"]) for r in records]
    cell = queues.SpawnCell("batched", n, n)
    ids = await queues.submit_all(url, path, bodies, n, submit_concurrency, cell)
    # Only the last call is long-polled while the queue drains (a reader polling every call would take the CPU of
    # the path it measures); the records are read once it is final. The figures come from the records' own times.
    give_up = cell.submit_first + queues.CELL_TIMEOUT_S
    if not read_while:
        await queues.read_all(url, ids[-1:], 1, give_up)
    cell.records, cell.unfinished = await queues.read_all(url, ids, 8, give_up)
    lat = cell.latencies_ms
    how = "every call long-polled as it goes, 8 readers" if read_while else "read once the last was final"
    return (f"Queued (spawn) calls of Batched.predict, {n:,} submitted by {submit_concurrency} connections ({how}): "
            f"submit {cell.submit_rate:,.0f}/s, {cell.e2e_rate:,.0f} calls/s from the first submit to the last "
            f"stored result ({cell.e2e_s:.1f} s), p50 {queues.nearest_rank(lat, 50):,.0f} ms, "
            f"not ok {cell.not_succeeded} ({GOAL}); a lone queued call, submit to "
            f"stored result: p50 {statistics.median(lone):,.1f} ms of 20, one at a time")


class _Results:
    """The results published on ``RESULTS_SUBJECT``, by ``Nats-Msg-Id`` (an event's call id is
    ``ev-<scope>-<Nats-Msg-Id>``): when each one came, and its status."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.status: dict[str, str] = {}
        self.changed = asyncio.Event()

    async def on_msg(self, msg: Any) -> None:
        headers = msg.headers or {}
        msg_id = headers.get("Ember-Call-Id", "").rpartition("-")[2]
        self.at.setdefault(msg_id, time.time())
        self.status[msg_id] = headers.get("Ember-Status", "")
        self.changed.set()

    async def wait_for(self, ids: Iterable[str], give_up_at: float) -> None:
        wanted = set(ids)
        while not wanted <= self.at.keys() and time.time() < give_up_at:
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), max(give_up_at - time.time(), 0.01))


async def events_rate(nats_url: str, auth_dir: Path, bodies: list[bytes], n: int, concurrency: int) -> str:
    """Publish ``n`` events (JetStream, a ``Nats-Msg-Id`` each) with ``concurrency`` publishers and wait for their
    results: calls/s from the first publish to the last result."""
    import nats

    from ember_platform.natsauth import keys

    creds = keys.load(auth_dir).platform_credentials()  # an event publisher needs NATS credentials
    nc = await nats.connect(nats_url, **creds.connect_options())
    js = nc.jetstream()
    results = _Results()
    await nc.subscribe(RESULTS_SUBJECT, cb=results.on_msg)
    await nc.flush()

    async def publish_all(count: int, lanes: int) -> tuple[dict[str, float], float, float]:
        sent: dict[str, float] = {}
        left = iter(range(count))

        async def lane() -> None:
            for i in left:
                msg_id = uuid.uuid4().hex
                sent[msg_id] = time.time()
                await js.publish(EVENTS_SUBJECT, bodies[i % len(bodies)], headers={"Nats-Msg-Id": msg_id})

        first = time.time()
        await asyncio.gather(*(lane() for _ in range(min(lanes, count))))
        return sent, first, time.time()

    try:
        warm, _, _ = await publish_all(100, concurrency)
        await results.wait_for(warm, time.time() + 120)
        lone = []
        for _ in range(20):
            one, _, _ = await publish_all(1, 1)
            await results.wait_for(one, time.time() + 60)
            lone += [1000 * (results.at[m] - at) for m, at in one.items() if m in results.at]
        sent, first, last = await publish_all(n, concurrency)
        await results.wait_for(sent, first + 600)
    finally:
        await nc.close()
    done = sent.keys() & results.at.keys()
    last_result = max(results.at[m] for m in done)
    lat = sorted(1000 * (results.at[m] - sent[m]) for m in done)
    failed = sum(results.status[m] != "succeeded" for m in done) + len(sent) - len(done)
    return (f"Queued calls from events (on_vectors, the same batched MLP), {n:,} JetStream publishes by {concurrency} "
            f"publishers: publish {n / (last - first):,.0f}/s, {len(done) / (last_result - first):,.0f} calls/s from "
            f"the first publish to the last result ({last_result - first:.1f} s), p50 "
            f"{lat[len(lat) // 2]:,.0f} ms, not ok {failed} ({GOAL}); a lone event, publish to result: p50 "
            f"{statistics.median(lone):,.1f} ms of 20, one at a time")
