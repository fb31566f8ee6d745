"""An answer that raises (before answers were encoded inside it: an output its encoder refused) fails its call alone:
the batcher's loop died with it, silently, and every later call of the function on that replica went unanswered."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from ember._errors import EmberError
from ember_runtime.batching.batcher import Batcher, Call


class Answers:
    """Each call's answers, in order; the call ``bad`` raises on its first answer."""

    def __init__(self) -> None:
        self.got: dict[str, list[tuple[Any, EmberError | None]]] = {}
        self.changed = asyncio.Event()

    def call(self, key: str, *, deadline: float | None = None) -> Call:
        async def answer(output: Any, error: EmberError | None, _size: int) -> None:
            self.got.setdefault(key, []).append((output, error))
            self.changed.set()
            if key == "bad" and len(self.got[key]) == 1:
                raise RecursionError("maximum recursion depth exceeded while serializing an object")

        return Call(key, time.time() + 60 if deadline is None else deadline, answer, call_id=key)

    async def wait_for(self, *keys: str) -> None:
        while not all(k in self.got for k in keys):
            self.changed.clear()
            await self.changed.wait()


@pytest.mark.parametrize("kind", ["batched", "unbatched", "slots"])
def test_the_loop_survives_an_answer_that_raises(kind):
    options: dict[str, Any] = {
        "batched": {"max_size": 4, "window_s": 0.0},
        "unbatched": {"max_size": 1, "window_s": 0.0, "run_ready": 64},
        "slots": {"max_size": 1, "window_s": 0.0, "slots": 2},
    }[kind]

    async def scenario() -> dict[str, list[tuple[Any, EmberError | None]]]:
        answers = Answers()
        with ThreadPoolExecutor(2) as pool:
            batcher = Batcher(lambda xs: [x.upper() for x in xs], executor=pool, name="f", **options)
            loop = asyncio.create_task(batcher.run_forever())
            batcher.submit(answers.call("bad"))
            batcher.submit(answers.call("beside"))
            await answers.wait_for("bad", "beside")
            batcher.submit(answers.call("next"))
            await answers.wait_for("next")
            batcher.close()
            await asyncio.wait_for(loop, 20)
        return answers.got

    got = asyncio.run(asyncio.wait_for(scenario(), 30))
    (first, _), (output, error) = got["bad"]
    assert first == "BAD" and output is None and error is not None and error.code == "internal"
    assert "RecursionError" in error.message
    assert got["beside"] == [("BESIDE", None)] and got["next"] == [("NEXT", None)]


def test_an_expired_calls_answer_that_raises_leaves_the_queue_served():
    async def scenario() -> dict[str, list[tuple[Any, EmberError | None]]]:
        answers = Answers()
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(lambda xs: list(xs), executor=pool, name="f", max_size=4, window_s=0.0)
            batcher.submit(answers.call("bad", deadline=time.time() - 1))  # expired: answered, never run
            loop = asyncio.create_task(batcher.run_forever())
            await answers.wait_for("bad")
            batcher.submit(answers.call("next"))
            await answers.wait_for("next")
            batcher.close()
            await asyncio.wait_for(loop, 20)
        return answers.got

    got = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [e.code for _, e in got["bad"] if e is not None] == ["deadline_exceeded", "internal"]
    assert got["next"] == [("next", None)]
