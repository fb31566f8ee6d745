"""A draining replica still hears cancels, on a real nats-server: a call queued behind a running batch that its
caller cancels while the replica drains is answered ``cancelled`` at once and never runs (not ignored for the whole
drain grace)."""

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
from ember._errors import CallCancelledError, EmberError
from ember.wire import natsflush, subjects
from ember_runtime.batching.batcher import Batcher, Call
from ember_runtime.batching.modelthread import ModelThread
from ember_runtime.replica import arguments, process

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory):
    with NatsCluster(tmp_path_factory.mktemp("nats"), size=1) as cluster:
        yield cluster.url


class _Worker:
    """A queue worker with nothing to pull (the queues are not what this test is about)."""

    def __init__(self, *_: Any, **__: Any) -> None:
        self.stop = asyncio.Event()

    async def run(self) -> None:
        await self.stop.wait()

    async def finish(self) -> None:
        return None


class _Status:
    async def put(self, *_: Any) -> None:
        return None

    async def delete(self, *_: Any) -> None:
        return None


def test_a_call_cancelled_while_the_replica_drains_is_answered_cancelled_at_once(nats_url, monkeypatch):
    release, started = threading.Event(), threading.Event()
    ran: list[Any] = []

    def model(xs: list[Any]) -> list[Any]:
        ran.extend(xs)
        started.set()
        release.wait(30)
        return xs

    async def scenario() -> dict[str, Any]:
        answers: dict[str, Any] = {}
        cancelled = asyncio.Event()

        def call(key: str) -> Call:
            async def answer(output: Any, error: EmberError | None, _: int) -> None:
                answers[key] = error or output
                if isinstance(error, CallCancelledError):
                    cancelled.set()

            return Call(key, time.time() + 60, answer, call_id=key)

        thread = ModelThread()
        batcher = Batcher(model, max_size=1, window_s=0.0, executor=thread, name="f")
        monkeypatch.setattr(process, "batcher_for", lambda *_: batcher)
        monkeypatch.setattr(process, "QueueWorker", _Worker)
        args = arguments.parse(["--nats", nats_url, "--bundle", ".", "--module", "m", "--app", "a", "--service", "s",
                                "--version", "1", "--replica-id", "r-drain", "--node-id", "n1"])
        replica = process.Replica(args, executor=thread)
        replica.calls, replica.kv = None, _Status()
        replica.service = SimpleNamespace(retries=0, timeout_s=60.0)
        nc, caller = await connect(nats_url), await connect(nats_url)
        try:
            endpoint = SimpleNamespace(spec=SimpleNamespace(name="f", on=None), steps=None)
            subs, loops = await replica._serve(nc, [endpoint])
            batcher.submit(call("running"))
            await asyncio.to_thread(started.wait, 10)
            batcher.submit(call("queued"))  # waits behind the running one
            replica.stop.set()
            draining = asyncio.create_task(replica._drain(subs, loops))
            while not batcher._closed and not draining.done():  # intake stopped: the replica drains
                await asyncio.sleep(0.01)
            await caller.publish(subjects.replica_cancel("r-drain"), b"queued")
            await natsflush.flush(caller)
            try:
                await asyncio.wait_for(cancelled.wait(), 5)  # the drain grace is 20 s
            finally:
                release.set()
                await asyncio.wait_for(draining, 30)
            return answers
        finally:
            await caller.close()
            await nc.close()
            thread.shutdown()

    answers = ember_loop.run(scenario())
    assert isinstance(answers["queued"], CallCancelledError)
    assert answers["running"] == "running" and ran == ["running"]  # the cancelled one never ran
