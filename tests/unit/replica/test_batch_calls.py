"""The call a batch serves, which the calls its function makes carry: the latest deadline of its calls (none gets
more time than it has) and every call's chain; and the batcher runs the function inside it, on the model thread."""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor

import ember
from ember.wire.calls import Hop
from ember_runtime.batching.batcher import Batcher, Call
from ember_runtime.replica.calling import batch_context, serving


async def _noop(*_: object) -> None:
    return None


def _call(deadline: float, call_id: str, *chain: Hop) -> Call:
    return Call(None, deadline, _noop, call_id, chain=list(chain))


def test_a_batch_serves_the_latest_deadline_and_every_chain() -> None:
    a, b = Hop(app="x", function="f"), Hop(app="y", function="g")
    context = batch_context("app", "fn", [_call(10.0, "c1", a), _call(30.0, "c2", a, b), _call(20.0, "c3")])
    assert (context.app, context.function, context.call_id) == ("app", "fn", "c1")
    assert context.deadline == 30.0 and context.chain == (a, b)
    assert batch_context("app", "fn", [_call(math.inf, "c")]).remaining_s() == math.inf


def test_the_function_sees_its_call_on_the_model_thread() -> None:
    seen: list[object] = []

    def run(values: list[object]) -> list[object]:
        seen.append(ember.current_call())
        return values

    async def one_call() -> None:
        answered = asyncio.Event()

        async def answer(*_: object) -> None:
            answered.set()

        with ThreadPoolExecutor(1) as executor:
            batcher = Batcher(run, max_size=4, window_s=0.0, executor=executor, name="fn",
                              serving=serving("app", "fn"))
            loop = asyncio.create_task(batcher.run_forever())
            batcher.submit(Call(1, time.time() + 5, answer, "c7", chain=[Hop(app="x", function="f")]))
            await asyncio.wait_for(answered.wait(), 5)
            batcher.close()
            await loop

    asyncio.run(one_call())
    (context,) = seen
    assert isinstance(context, ember.CallContext) and context.call_id == "c7"
    assert context.chain == (Hop(app="x", function="f"),) and 0 < context.remaining_s() <= 5
    assert ember.current_call() is None  # nothing leaks out of the batch
