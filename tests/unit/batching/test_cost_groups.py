"""Batches grouped by cost (``group_by_cost``): a call they pick is forgotten once answered, like any other."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from test_batcher import Gate, Recorder, run, serve

from ember_runtime.batching.batcher import Batcher


def test_a_call_picked_by_cost_is_forgotten_once_answered_and_a_late_cancel_answers_nothing():
    gate = Gate(lambda xs: [2 * x for x in xs])
    rec = Recorder()  # fails on a second answer
    costs = {1: 1.0, 2: 100.0, 3: 100.0, 4: 100.0, 5: 1.0, 6: 1.0, 7: 1.0}
    with ThreadPoolExecutor(1) as pool:
        b = Batcher(gate, max_size=4, window_s=0.01, executor=pool, group_by_cost=True, name="g")

        async def body() -> list[str]:
            b.submit(rec.call(0))
            await asyncio.to_thread(gate.started.wait)
            for key, cost in costs.items():  # 5 and 6 join 1 in a batch from beyond the first four waiting
                b.submit(rec.call(key, cost=cost))
            gate.release.set()
            await rec.wait_for(8)
            return [await b.withdraw(str(key)) for key in range(8)]

        late = run(lambda: serve(b, body))
    assert any({1, 5, 6} <= set(batch) for batch in gate.batches)  # picked from the heap by their cost
    assert late == [""] * 8  # none is held any more: nothing to cancel, nobody answered twice
    assert b._by_id == {} and b._live == {}  # nothing answered stays referenced
    assert {k: v[0] for k, v in rec.answers.items()} == {k: 2 * k for k in range(8)}
