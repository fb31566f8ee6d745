"""A test subject: generator functions that stream, and functions that hold many calls at once."""

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator

import msgspec

import ember

app = ember.App("streams")


class Tick(msgspec.Struct):
    i: int
    at: float  # when the replica produced it (epoch seconds)
    pad: str = ""


@app.model(max_concurrency=8, timeout_s=30)
class Streamer:
    """Generators of every kind in one replica, which remembers which of its generators were closed."""

    @ember.setup
    def start(self) -> None:
        self.closed: list[str] = []

    @ember.method
    def count(self, n: int, delay: float = 0.0) -> Iterator[Tick]:
        for i in range(n):
            if delay:
                time.sleep(delay)
            yield Tick(i=i, at=time.time())

    @ember.method
    def fails_after(self, n: int) -> Iterator[int]:
        yield from range(n)
        raise ValueError(f"broke after {n} items")

    @ember.method
    def forever(self) -> Iterator[int]:
        i = 0
        while True:
            yield i
            i += 1
            time.sleep(0.01)

    @ember.method
    def ticks(self, tag: str) -> Iterator[int]:
        """Endless; notes ``tag`` once closed."""
        try:
            i = 0
            while True:
                yield i
                i += 1
                time.sleep(0.05)
        finally:
            self.closed.append(tag)

    @ember.method
    async def aticks(self, tag: str) -> AsyncIterator[int]:
        """The same, as an async generator."""
        try:
            i = 0
            while True:
                yield i
                i += 1
                await asyncio.sleep(0.05)
        finally:
            self.closed.append(tag)

    @ember.method
    async def slow_start(self, tag: str) -> AsyncIterator[int]:
        """Waits a while before its first item; notes ``tag`` once closed."""
        try:
            await asyncio.sleep(20.0)
            yield 0
        finally:
            self.closed.append(tag)

    @ember.method
    def echo(self, text: str) -> str:
        return text

    @ember.method
    def closed_tags(self) -> list[str]:
        return list(self.closed)

    @ember.method
    def big(self, n: int, kb: int) -> Iterator[Tick]:
        """``n`` items of ``kb`` KiB each, as fast as they can go (when the reader lets them)."""
        pad = "x" * (kb * 1024)
        for i in range(n):
            yield Tick(i=i, at=time.time(), pad=pad)

    @ember.method
    def many(self, n: int) -> Iterator[str]:
        for i in range(n):
            yield f"item-{i}"


@app.function(max_concurrency=32)
async def nap(seconds: float) -> dict:
    """Sleeps on the replica's event loop; answers the name of the thread it ran on and when it slept."""
    started = time.time()
    await asyncio.sleep(seconds)
    return {"thread": threading.current_thread().name, "span": [started, time.time()]}


@app.function(max_concurrency=32)
def doze(seconds: float) -> dict:
    """Sleeps on one of the replica's threads; answers that thread's name and when it slept."""
    started = time.time()
    time.sleep(seconds)
    return {"thread": threading.current_thread().name, "span": [started, time.time()]}
