"""A bench subject: the same 10 ms wait three ways, to compare what max_concurrency lets one replica hold."""

import asyncio
import time

import ember

app = ember.App("concurrency")


@app.function(max_concurrency=64)
async def nap64(seconds: float) -> float:
    """On the replica's event loop, up to 64 calls at once."""
    await asyncio.sleep(seconds)
    return seconds


@app.function(max_concurrency=64)
def doze64(seconds: float) -> float:
    """In a pool of 64 threads."""
    time.sleep(seconds)
    return seconds


@app.function()
async def nap1(seconds: float) -> float:
    """On the event loop, one call at a time (the default)."""
    await asyncio.sleep(seconds)
    return seconds
