"""A test subject for calls between functions: what a called function sees of its call, a slow one, and one that
calls back into its caller's app (a cycle)."""

import asyncio
import math
import time

import ember

app = ember.App("fn-callee", calls=["fn-caller"])


def _seen() -> dict:
    call = ember.current_call()
    assert call is not None
    remaining = call.remaining_s()
    return {"remaining_s": remaining if math.isfinite(remaining) else None, "call_id": call.call_id,
            "chain": [f"{hop.app}.{hop.function}" for hop in call.chain]}


@app.function(timeout_s=60)
def echo(x: int) -> dict:
    """``x`` back, with the deadline and chain of calls this call carries."""
    return {"x": x, **_seen()}


@app.function(timeout_s=60, min_replicas=1, max_replicas=1)
def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@app.function(timeout_s=60, max_concurrency=16)
async def nap(seconds: float) -> float:
    """Sleeps without holding a thread: many calls of it overlap on one replica."""
    await asyncio.sleep(seconds)
    return seconds


@app.function(timeout_s=10)
def unavailable(x: int) -> int:
    """Says it cannot serve (as a dependency that is down would)."""
    raise ember.UnavailableError("the model is warming up", retry_after_s=2.0)


@app.function(timeout_s=60)
def count(n: int):
    """A generator function: the chain of calls waiting on it, then 0 .. n-1."""
    yield _seen()["chain"]
    yield from range(n)


@app.function(timeout_s=60)
def back(x: int) -> dict:
    """Calls ``fn-caller.Caller.cycle``, the function that calls this one: a cycle."""
    return ember.lookup("fn-caller", "Caller.cycle").remote(x)
