"""A test subject for calls between functions: a class model (one replica) whose methods call ``fn-callee``'s
functions (and others') from inside a replica: blocking, async, in a batch, spawned; each answers what the call
answered (its value, or its error and how long it waited)."""

import asyncio
import time
from typing import Any

import ember

app = ember.App("fn-caller", calls=["fn-callee"])


def _outcome(work) -> dict:
    started = time.monotonic()
    try:
        return {"ok": work(), "waited_s": time.monotonic() - started}
    except ember.EmberError as exc:
        return {"code": exc.code, "type": type(exc).__name__, "message": exc.message,
                "waited_s": time.monotonic() - started}


@app.model(timeout_s=60)
class Caller:
    @ember.method
    def relay(self, x: int) -> dict:
        """``fn-callee.echo(x)``, blocking, on the model thread."""
        return ember.lookup("fn-callee", "echo").remote(x)

    @ember.method
    def relay_aio(self, x: int) -> dict:
        """``fn-callee.echo(x)`` from async code (an event loop of this thread's own)."""
        return asyncio.run(ember.lookup("fn-callee", "echo").remote.aio(x))

    @ember.method
    def attempt(self, app_name: str, function: str, arg: Any, timeout_s: float = 0.0) -> dict:
        """Calls ``app_name.function(arg)``; answers its value or its error, and how long it waited."""
        handle = ember.lookup(app_name, function)
        if timeout_s:
            handle = handle.with_options(timeout_s=timeout_s)
        return _outcome(lambda: handle.remote(arg))

    @ember.method
    def fan(self, xs: list[int]) -> list[int]:
        """``fn-callee.echo`` over ``xs`` with ``.map()``."""
        return [r["x"] for r in ember.lookup("fn-callee", "echo").map(xs, max_concurrency=4)]

    @ember.method(batch=ember.Batch(max_size=8, window_ms=200))
    def batched(self, xs: list[int]) -> list[dict]:
        """A batched method whose batch calls ``fn-callee.echo`` once per input; slow enough that calls sent
        together wait for the first batch and run together in the next."""
        time.sleep(0.3)
        out = list(ember.lookup("fn-callee", "echo").map(xs))
        return [{"x": r["x"], "chain": r["chain"], "batch": len(xs)} for r in out]

    @ember.method
    def spawner(self, x: int, wait: bool = False) -> dict:
        """Spawns ``fn-callee.echo(x)``; with ``wait``, fetches its result too."""
        call = ember.lookup("fn-callee", "echo").spawn(x)
        return {"call_id": call.call_id, "result": call.get(timeout=30) if wait else None}

    @ember.method
    def cycle(self, x: int) -> dict:
        """Calls ``fn-callee.back``, which calls this method again."""
        return _outcome(lambda: ember.lookup("fn-callee", "back").remote(x))

    @ember.method
    def passthrough(self, key: str) -> int:
        """Counts its runs under ``key``, then calls ``fn-callee.unavailable`` and lets its error out."""
        self.runs = getattr(self, "runs", {})
        self.runs[key] = self.runs.get(key, 0) + 1
        return ember.lookup("fn-callee", "unavailable").remote(1)

    @ember.method
    def runs_of(self, key: str) -> int:
        return getattr(self, "runs", {}).get(key, 0)

    @ember.method
    def items(self, n: int) -> list:
        """``fn-callee.count(n)``'s items, with ``remote_gen``."""
        return list(ember.lookup("fn-callee", "count").remote_gen(n))

    @ember.method
    def itself(self, x: int) -> dict:
        """Calls itself."""
        return _outcome(lambda: ember.lookup("fn-caller", "Caller.itself").remote(x))


@app.function(timeout_s=60, max_concurrency=8)
async def in_async(seconds: float, blocking: bool = False) -> dict:
    """An ``async def`` function awaiting ``fn-callee.nap`` on the replica's event loop (``blocking``: calling it the
    blocking way there instead, which is refused)."""
    nap = ember.lookup("fn-callee", "nap")
    if blocking:
        return _outcome(lambda: nap.remote(seconds))
    call, started = ember.current_call(), time.time()
    return {"ok": await nap.remote.aio(seconds), "call_id": call.call_id if call else None,
            "span": [started, time.time()]}  # when it waited: calls that waited together overlap


@app.function(timeout_s=60, max_concurrency=4)
def in_threads(seconds: float) -> dict:
    """A sync function with four threads, each call waiting on ``fn-callee.nap`` (not on the event loop); answers
    its value and when it waited."""
    started = time.time()
    return {"ok": ember.lookup("fn-callee", "nap").remote(seconds), "span": [started, time.time()]}
