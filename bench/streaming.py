"""Streaming and concurrent inputs, measured through one embedded platform, in interleaved rounds.

What is measured (apps: tests/apps/streams, tests/apps/concurrency):

    * ``plain p50``: a plain call's latency, ``POST /v1/streams/Streamer.echo`` (same replica as the streams);
    * ``first item p50``: time to the first item of a streamed call, ``POST /v1/streams/Streamer.many`` read as
      NDJSON, from the request's start to the first item's line (the stream then runs to its end);
    * ``items/s``: items per second of one stream of ``--items`` small items (``Streamer.many``), NDJSON and SSE;
    * ``calls/s at 64``: a function that waits 10 ms, 64 concurrent closed-loop clients (the load generator of
      ``bench/http_latency.py``): ``async def`` with ``max_concurrency=64``, sync with 64 threads, and
      ``async def`` with the default ``max_concurrency=1`` (the ceiling without concurrency: 100 calls/s).

Each round measures every row once, in an order that rotates; the table shows medians over the rounds.

Usage
    python bench/streaming.py [--rounds N] [--quick] [--items N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from http_latency import FULL, QUICK, ROOT, Plan, Target, markdown_table, measure, run_interruptible, say  # noqa: E402

from ember import _loop as ember_loop  # noqa: E402

if TYPE_CHECKING:
    from httpx import AsyncClient

SAMPLES = 50  # sequential calls per latency measurement
WAIT_S = 0.01
CONCURRENT = ("nap64", "doze64", "nap1")


async def _plain_p50(client: AsyncClient, url: str) -> float:
    times = []
    for _ in range(SAMPLES):
        started = time.perf_counter()
        response = await client.post(f"{url}/v1/streams/Streamer.echo", json="x")
        response.raise_for_status()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def _first_item_p50(client: AsyncClient, url: str) -> float:
    times = []
    for _ in range(SAMPLES):
        started = time.perf_counter()
        async with client.stream("POST", f"{url}/v1/streams/Streamer.many", json=3) as response:
            lines = response.aiter_lines()
            first = await anext(lines)
            times.append((time.perf_counter() - started) * 1000)
            assert first.startswith('{"item"'), first
            async for _ in lines:
                pass
    return statistics.median(times)


async def _items_per_s(client: AsyncClient, url: str, items: int, accept: str) -> float:
    started = time.perf_counter()
    count = 0
    async with client.stream("POST", f"{url}/v1/streams/Streamer.many", json=items,
                             headers={"Accept": accept}) as response:
        async for line in response.aiter_lines():
            count += line.startswith('{"item"') or line.startswith("data: ")
    took = time.perf_counter() - started
    assert count >= items, (count, items)
    return items / took


def run(rounds: int, plan: Plan, items: int) -> dict[str, list[float]]:
    import httpx

    import ember
    from ember._client import Transport
    from ember.dev.embedded import EmbeddedPlatform

    work = Path(tempfile.mkdtemp(prefix="ember-streaming-bench-"))
    platform = EmbeddedPlatform(work / "state", http_port=0)
    results: dict[str, list[float]] = {}
    try:
        platform.start()
        transport = Transport(platform.url, token=platform.token)
        for app in ("streams/streams.py", "concurrency/concurrency.py"):
            say(f"deploying {app}")
            ember.deploy(ROOT / "tests" / "apps" / app, transport=transport, timeout_s=180)
        transport.close()
        url, token = platform.url, platform.token
        body = str(WAIT_S).encode()
        targets = {name: Target(f"concurrency.{name}", f"{url}/v1/concurrency/{name}", [body], is_ember=True,
                                token=token) for name in CONCURRENT}

        async def rounds_() -> None:
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
                rows: dict[str, Callable[[], Awaitable[float]]] = {
                    "plain p50 (ms)": lambda: _plain_p50(client, url),
                    "first item p50 (ms)": lambda: _first_item_p50(client, url),
                    "items/s, NDJSON": lambda: _items_per_s(client, url, items, "application/x-ndjson"),
                    "items/s, SSE": lambda: _items_per_s(client, url, items, "text/event-stream"),
                }
                for name, target in targets.items():
                    rows[f"calls/s at 64, {name}"] = (lambda t=target: _rps(t, plan))
                names = list(rows)
                for r in range(rounds):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        say(f"round {r + 1}/{rounds}: {name}")
                        results.setdefault(name, []).append(await rows[name]())

        ember_loop.run(rounds_())
    finally:
        platform.stop()
        shutil.rmtree(work, ignore_errors=True)
    return results


async def _rps(target: Target, plan: Plan) -> float:
    cell = await measure(target, 64, plan)
    if cell.errors:
        say(f"{target.name}: {cell.errors} errors")
    return cell.rps


def render(results: dict[str, list[float]], rounds: int) -> str:
    rows = [[f"median of {rounds} rounds", "value", "min", "max"]]
    for name, values in results.items():
        fmt = "{:.2f}" if "(ms)" in name else "{:,.0f}"
        rows.append([name, fmt.format(statistics.median(values)), fmt.format(min(values)), fmt.format(max(values))])
    return markdown_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="shorter windows, for a smoke run")
    parser.add_argument("--items", type=int, default=20_000, help="items in the items/s stream (default 20000)")
    args = parser.parse_args()
    print(render(run_interruptible(lambda: run(args.rounds, QUICK if args.quick else FULL, args.items)), args.rounds))


if __name__ == "__main__":
    main()
