"""A Continuous step that hangs (a wedged kernel, a deadlock) is seen: its calls end at their deadlines and the
batcher frees their slots, but the replica's stuck watch sees the step run on and gives way, and its load reports
count the sequences the step holds (the router would otherwise prefer the wedged replica, reported idle)."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from support.nats_cluster import NatsCluster
from support.natsconn import connect

from ember import _loop as ember_loop
from ember._errors import DeadlineExceededError, EmberError
from ember.wire import load_decoder, natsflush, subjects
from ember.wire.openai import CompletionRequest
from ember_runtime.batching.batcher import Batcher, Call
from ember_runtime.batching.modelthread import ModelThread
from ember_runtime.replica import process
from ember_runtime.replica.continuous import StepLoop

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory):
    with NatsCluster(tmp_path_factory.mktemp("nats"), size=1) as cluster:
        yield cluster.url


async def _hung(body) -> tuple[list[Any], Any]:
    """Four sequences in a step that hangs, their calls past their deadlines; then ``body(batcher, steps)``."""
    hang = threading.Event()

    def step(seqs: list[Any]) -> list[str | None]:
        hang.wait(30)
        return [None for _ in seqs]

    steps = StepLoop(step, "gen")

    async def arun(values: list[Any]) -> list[Any]:  # as ``Endpoint.arun`` runs a Continuous method's call
        return [await steps.generate(v, "", time.time() + 0.3, None) for v in values]

    thread = ModelThread()
    batcher = Batcher(arun, max_size=1, window_s=0, executor=thread, slots=4, name="gen")
    loop = asyncio.create_task(batcher.run_forever())
    answers: list[Any] = []
    ended = asyncio.Event()

    async def answer(output: Any, error: EmberError | None, _: int) -> None:
        answers.append(error or output)
        if len(answers) == 4:
            ended.set()

    try:
        for i in range(4):
            batcher.submit(Call(CompletionRequest(model="m", prompt="hi"), time.time() + 0.3, answer, f"c{i}"))
        await asyncio.wait_for(ended.wait(), 10)
        assert batcher.in_flight == 0 and batcher.running_since is None  # the batcher freed every slot
        return answers, await body(batcher, steps)
    finally:
        hang.set()
        batcher.close()
        await loop
        steps.close()
        thread.shutdown()


def test_the_stuck_watch_sees_a_step_that_hangs_and_gives_way(monkeypatch):
    monkeypatch.setattr(process, "STUCK_GRACE_S", 0.2)
    monkeypatch.setattr(process, "STUCK_CHECK_S", 0.02)

    async def watch(batcher: Batcher, steps: StepLoop) -> list[str]:
        reasons: list[str] = []

        async def give_way(_subs: Any, _intake: Any, reason: str) -> None:
            reasons.append(reason)

        replica = SimpleNamespace(stop=asyncio.Event(), batchers=[batcher], endpoints=[SimpleNamespace(steps=steps)],
                                  service=SimpleNamespace(timeout_s=0.3), _give_way=give_way)
        await asyncio.wait_for(process.Replica._watch_stuck(replica, [], []), 10)  # type: ignore[arg-type]
        return reasons

    answers, reasons = ember_loop.run(_hung(watch))
    assert all(isinstance(a, DeadlineExceededError) for a in answers)
    assert len(reasons) == 1 and "a call of gen ran past its timeout_s" in reasons[0]


def test_the_load_report_counts_the_sequences_a_hung_step_holds(nats_url):
    async def report(batcher: Batcher, steps: StepLoop) -> Any:
        nc, gateway = await connect(nats_url), await connect(nats_url)
        got: asyncio.Queue[Any] = asyncio.Queue()
        stop = asyncio.Event()

        async def next_report(idle: bool) -> None:
            stop.set()  # one round of reports is enough

        async def on_report(msg: Any) -> None:
            await got.put(load_decoder.decode(msg.data))

        try:
            await gateway.subscribe(subjects.stats("a", "gen"), cb=on_report)
            await natsflush.flush(gateway)
            replica = SimpleNamespace(stop=stop, stuck=False, batchers=[batcher], _next_report=next_report,
                                      streams=SimpleNamespace(accepted=0),
                                      args=SimpleNamespace(replica_id="r1", app="a", version=1))
            endpoint = SimpleNamespace(spec=SimpleNamespace(name="gen"), steps=steps)
            await process.Replica._report_load(replica, nc, [endpoint])  # type: ignore[arg-type]
            await natsflush.flush(nc)
            return await asyncio.wait_for(got.get(), 10)
        finally:
            await nc.close()
            await gateway.close()

    _, sent = ember_loop.run(_hung(report))
    assert sent.in_flight == 4 and sent.slots == 4  # full: the router sends this replica nothing more
