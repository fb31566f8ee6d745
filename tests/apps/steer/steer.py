"""The test subject of the SDK's call verbs (tests/integration/test_sdk_calls.py).

A call's input steers ``f``: ``{"sleep": s}`` makes it take ``s`` seconds, ``{"fail": msg}`` makes it raise
ValueError(msg), ``{"value": v}`` is its result (else the input itself is); calls with ``{"group": g}`` are counted,
and ``{"peak": g}`` answers how many of group ``g`` ran at once (one replica: ``f`` is its only service's function).
"""

import asyncio
from typing import Any

import msgspec

import ember

app = ember.App("steer")
_running: dict[str, int] = {}
_peak: dict[str, int] = {}


class Point(msgspec.Struct):
    x: float
    y: float


@app.function(max_concurrency=32, retries=0)
async def f(body: Any) -> Any:
    if not isinstance(body, dict):
        return body
    if "peak" in body:
        return _peak.get(body["peak"], 0)
    group = body.get("group", "")
    _running[group] = _running.get(group, 0) + 1
    _peak[group] = max(_peak.get(group, 0), _running[group])
    try:
        await asyncio.sleep(body.get("sleep", 0.0))
        if "fail" in body:
            raise ValueError(body["fail"])
        return body.get("value", body)
    finally:
        _running[group] -= 1


@app.function(retries=0)
async def one(seconds: float) -> float:
    """One call at a time: a second call waits in the queue while the first sleeps."""
    await asyncio.sleep(seconds)
    return seconds


@app.function()
def move(p: Point) -> Point:
    return p


@app.function()
def add(a: int, b: int = 0) -> int:
    return a + b
