"""Language models through the OpenAI-compatible routes: continuous batching's gain, time to first token under load,
and the platform's own cost per streamed token, in interleaved rounds on one embedded platform.

    python bench/llm.py [--rounds 5]

Model: examples/tiny_gpt (a 2-layer torch GPT built from its config, CPU). Rows: aggregate tokens/s of 16 concurrent
streams of 64 tokens against the same 16 one at a time; time to first token p50 under 16 streams against a lone
stream's (at the client, and at the gateway: the mean of ``vllm:time_to_first_token_seconds`` in /metrics, from a
request's arrival to its first piece, which leaves out the client's own time), the 16 sent at once; the same for a
stream that joins 15 running ones (16 callers sending streams of 32 to 96 tokens back to back); and per streamed
token, for
tests/apps/llm's echo-words model (a generator of 2,000 words) streamed through the platform: the CPU time the
platform's processes spent meanwhile (the control plane with its gateway, nats-server, the node agent and the
replicas: every process this one started, from ``/proc/<pid>/stat``) minus the CPU of the same generator run in
process, divided by the pieces; and the stream's wall time minus the generator's, per piece. Last, the NATS
messages that carried 16 streams' pieces to the gateway (``_EMBER.answers.>``, counted by a subscriber of its own,
in a run of its own: the count's cost stays out of the other rows), per piece.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import json
import os
import random
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

from ember import _loop as ember_loop

STREAMS, TOKENS, WORDS = 16, 64, 2000


_SENT: contextvars.ContextVar[list[float]] = contextvars.ContextVar("sent")


async def _on_request(_request) -> None:  # httpx's request hook, in the task of the call that sends it
    with contextlib.suppress(LookupError):
        _SENT.get().append(time.perf_counter())


async def _stream(client, model: str, prompt: str, max_tokens: int) -> tuple[float, float, int, float]:
    """(time to first piece, total time, pieces, time from the request's send to the first piece) of one streamed
    completion. The first is from the call to the client, so under 16 streams it includes the client's own time
    building the other streams' requests on this event loop; the last starts when httpx sends this request.

    The client is a plain httpx one that reads the event stream as bytes (it decodes the first piece's event only
    and counts the others): OpenAI's client builds a typed object of every chunk, about as much CPU per piece as the
    platform spends, and with 16 streams on the same two cores its own backlog was most of what it measured."""
    sent: list[float] = []
    _SENT.set(sent)
    started = time.perf_counter()
    first, seen, counts = 0.0, b"", Counts()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    async with client.stream("POST", "/openai/v1/completions", json=body) as response:
        response.raise_for_status()
        async for chunk in response.aiter_raw():
            counts.add(chunk)
            if not first:
                seen += chunk
                first = time.perf_counter() - started if _has_text(seen) else 0.0
    return first, time.perf_counter() - started, counts.pieces, first + started - sent[-1]


class Counts:
    """Pieces in an event stream read in chunks: events (``data: {``) less those with no text (the last one, with
    its finish reason), each marker counted once even when a chunk's edge cuts it."""

    EVENT, EMPTY = b"data: {", b'"text":""'

    def __init__(self) -> None:
        self.pieces = 0
        self._tails = [b"", b""]

    def add(self, chunk: bytes) -> None:
        for i, (marker, sign) in enumerate(((self.EVENT, 1), (self.EMPTY, -1))):
            data = self._tails[i] + chunk
            self.pieces += sign * data.count(marker)
            self._tails[i] = data[-(len(marker) - 1):]


def _has_text(seen: bytes) -> bool:
    """Whether a complete event in ``seen`` (the stream so far) carries text."""
    for event in seen.split(b"\n\n")[:-1]:
        if event.startswith(b"data: {"):
            choices = json.loads(event[len(b"data: "):])["choices"]
            if choices and choices[0]["text"]:
                return True
    return False


async def _together(client) -> tuple[float, float, float]:
    """Aggregate tokens/s and TTFT p50 (ms; from the call, from the request's send) of 16 concurrent streams."""
    started = time.perf_counter()
    runs = await asyncio.gather(*(_stream(client, "tiny-gpt", f"prompt {i}", TOKENS) for i in range(STREAMS)))
    took = time.perf_counter() - started
    return (sum(r[2] for r in runs) / took, statistics.median(r[0] for r in runs) * 1000,
            statistics.median(r[3] for r in runs) * 1000)


async def _running(client, per_stream: int = 4) -> float:
    """TTFT p50 (ms, from the request's send) of streams that join while 15 others run: 16 callers each send
    ``per_stream`` streams back to back, of 32 to 96 tokens (64 on average; seeded), so that after the first
    wave (a burst, left out) each new stream arrives alone, into a running batch, as in a server under steady load."""
    lengths = random.Random(16).choices(range(32, 97), k=STREAMS * per_stream)

    async def caller(i: int) -> list[float]:
        runs = [await _stream(client, "tiny-gpt", f"prompt {i}.{n}", lengths[i * per_stream + n])
                for n in range(per_stream)]
        return [r[3] for r in runs[1:]]

    joined = [t for ttfts in await asyncio.gather(*(caller(i) for i in range(STREAMS))) for t in ttfts]
    return statistics.median(joined) * 1000


async def _one_at_a_time(client) -> tuple[float, float, float]:
    started, runs = time.perf_counter(), []
    for i in range(STREAMS):
        runs.append(await _stream(client, "tiny-gpt", f"prompt {i}", TOKENS))
    return (sum(r[2] for r in runs) / (time.perf_counter() - started), statistics.median(r[0] for r in runs) * 1000,
            statistics.median(r[3] for r in runs) * 1000)


_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _platform_cpu_s() -> float:
    """CPU seconds (user + system) spent so far by every live process descended from this one (the platform's)."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        ticks[int(entry)] = int(fields[11]) + int(fields[12])
    mine, total = {os.getpid()}, 0
    for _ in range(8):  # a few generations: nats-server, the control plane, the agent, its replicas (and sandboxes)
        mine |= {pid for pid, parent in parents.items() if parent in mine}
    for pid in mine - {os.getpid()}:
        total += ticks.get(pid, 0)
    return total * _TICK_S


def _gateway_ttft(url: str, token: str) -> tuple[float, float]:
    """(sum of seconds, count) of ``vllm:time_to_first_token_seconds`` for tiny-gpt, from the gateway's /metrics."""
    import httpx

    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    found = [float(re.search(rf'vllm:time_to_first_token_seconds_{part}{{[^}}]*model_name="tiny-gpt"[^}}]*}} (\S+)',
                             text).group(1)) for part in ("sum", "count")]  # type: ignore[union-attr]
    return found[0], found[1]


async def _platform_cost(chat) -> tuple[float, float]:
    """ms per streamed token of echo-words through the platform, minus the same generator in process: (the
    platform's processes' CPU, the stream's wall time)."""
    text = " ".join(f"w{i}" for i in range(WORDS))
    cpu, started = _platform_cpu_s(), time.perf_counter()
    stream = await chat.chat.completions.create(model="echo-words", stream=True, max_tokens=WORDS,
                                                messages=[{"role": "user", "content": text}])
    pieces = sum([1 async for c in stream if c.choices and c.choices[0].delta.content])
    through, cpu = time.perf_counter() - started, _platform_cpu_s() - cpu
    own, started = time.process_time(), time.perf_counter()
    local = [word + " " for word in text.split()]  # what echo-words does in process
    alone, own = time.perf_counter() - started, time.process_time() - own
    assert pieces >= WORDS - 1 and len(local) == WORDS, pieces
    return (cpu - own) / WORDS * 1000, (through - alone) / WORDS * 1000


async def _messages_per_piece(client, nats_url: str, options: dict) -> float:
    """NATS messages on the gateways' answer subjects per piece, 16 streams together."""
    import nats

    from ember.wire import subjects

    nc = await nats.connect(nats_url, **options)
    seen = 0

    async def count(_msg) -> None:
        nonlocal seen
        seen += 1

    await nc.subscribe(f"{subjects.ANSWERS_ROOT}.>", cb=count)
    await nc.flush()
    runs = await asyncio.gather(*(_stream(client, "tiny-gpt", f"prompt {i}", TOKENS) for i in range(STREAMS)))
    await nc.flush()
    await nc.close()
    return seen / sum(r[2] for r in runs)


def run(rounds: int) -> dict[str, list[float]]:
    import httpx
    import openai

    import ember
    from ember._client import Transport
    from ember.dev.embedded import EmbeddedPlatform

    work = Path(tempfile.mkdtemp(prefix="ember-llm-bench-"))
    platform = EmbeddedPlatform(work / "state", http_port=0)
    results: dict[str, list[float]] = {}
    try:
        platform.start()
        transport = Transport(platform.url, token=platform.token)
        for app in (ROOT / "examples" / "tiny_gpt" / "app.py", ROOT / "tests" / "apps" / "llm" / "llm.py"):
            say(f"deploying {app.name}")
            ember.deploy(app, transport=transport, timeout_s=180)
        transport.close()

        async def rounds_() -> None:
            client = openai.AsyncOpenAI(base_url=f"{platform.url}/openai/v1", api_key=platform.token, timeout=300,
                                        http_client=openai.DefaultAsyncHttpxClient(
                                            event_hooks={"request": [_on_request]}))
            raw = httpx.AsyncClient(base_url=platform.url, headers={"Authorization": f"Bearer {platform.token}"},
                                    timeout=300, event_hooks={"request": [_on_request]},
                                    limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))
            await _stream(raw, "tiny-gpt", "warm up", 8)

            def gateway(name: str, since: tuple[float, float]) -> None:
                now = _gateway_ttft(platform.url, platform.token)
                results.setdefault(name, []).append((now[0] - since[0]) / (now[1] - since[1]) * 1000)

            async def together() -> None:
                since = _gateway_ttft(platform.url, platform.token)
                rate, ttft, from_send = await _together(raw)
                gateway("TTFT mean at the gateway, under 16 streams (ms)", since)
                results.setdefault("tokens/s, 16 streams together", []).append(rate)
                results.setdefault("TTFT p50 under 16 streams (ms)", []).append(ttft)
                results.setdefault("TTFT p50 from the send, under 16 streams (ms)", []).append(from_send)

            async def running() -> None:
                since = _gateway_ttft(platform.url, platform.token)
                results.setdefault("TTFT p50 from the send, joining 15 running streams (ms)", []).append(
                    await _running(raw))
                gateway("TTFT mean at the gateway, joining 15 running streams (ms)", since)

            async def alone() -> None:
                since = _gateway_ttft(platform.url, platform.token)
                rate, ttft, from_send = await _one_at_a_time(raw)
                gateway("TTFT mean at the gateway, a lone stream (ms)", since)
                results.setdefault("tokens/s, 16 streams one at a time", []).append(rate)
                results.setdefault("TTFT p50, a lone stream (ms)", []).append(ttft)
                results.setdefault("TTFT p50 from the send, a lone stream (ms)", []).append(from_send)

            async def cost() -> None:
                cpu, wall = await _platform_cost(client)
                results.setdefault("platform CPU ms per streamed token", []).append(cpu)
                results.setdefault("platform wall ms per streamed token", []).append(wall)

            async def messages() -> None:
                per_piece = await _messages_per_piece(raw, platform.nats_url,
                                                      platform.nats_credentials.connect_options())
                results.setdefault("NATS messages per piece, 16 streams together", []).append(per_piece)

            rows: list[Callable[[], Awaitable[None]]] = [together, alone, running, cost, messages]
            for r in range(rounds):
                for row in rows[r % len(rows):] + rows[:r % len(rows)]:
                    say(f"round {r + 1}/{rounds}: {row.__name__}")
                    await row()
            await client.close()
            await raw.aclose()

        ember_loop.run(rounds_())
    finally:
        platform.stop()
        shutil.rmtree(work, ignore_errors=True)
    return results


def render(results: dict[str, list[float]], rounds: int) -> str:
    results = {**results,  # each round's ratios too
               "gain: together / one at a time (x)": [a / b for a, b in zip(
                   results["tokens/s, 16 streams together"], results["tokens/s, 16 streams one at a time"],
                   strict=True)],
               "TTFT p50: under 16 / lone (x)": [a / b for a, b in zip(
                   results["TTFT p50 under 16 streams (ms)"], results["TTFT p50, a lone stream (ms)"], strict=True)],
               "TTFT p50 from the send: under 16 / lone (x)": [a / b for a, b in zip(
                   results["TTFT p50 from the send, under 16 streams (ms)"],
                   results["TTFT p50 from the send, a lone stream (ms)"], strict=True)],
               "TTFT p50 from the send: joining 15 running / lone (x)": [a / b for a, b in zip(
                   results["TTFT p50 from the send, joining 15 running streams (ms)"],
                   results["TTFT p50 from the send, a lone stream (ms)"], strict=True)],
               "TTFT mean at the gateway: under 16 / lone (x)": [a / b for a, b in zip(
                   results["TTFT mean at the gateway, under 16 streams (ms)"],
                   results["TTFT mean at the gateway, a lone stream (ms)"], strict=True)]}
    rows = [[f"median of {rounds} rounds", "value", "min", "max"]]
    for name in sorted(results):
        values = results[name]
        fmt = "{:.3f}" if "per streamed token" in name or "per piece" in name else \
            "{:.2f}" if "(x)" in name else "{:,.1f}"
        rows.append([name, fmt.format(statistics.median(values)), fmt.format(min(values)), fmt.format(max(values))])
    median = {name: statistics.median(v) for name, v in results.items()}
    gain = median["tokens/s, 16 streams together"] / median["tokens/s, 16 streams one at a time"]
    ttft = median["TTFT p50 under 16 streams (ms)"] / median["TTFT p50, a lone stream (ms)"]
    sent = (median["TTFT p50 from the send, under 16 streams (ms)"]
            / median["TTFT p50 from the send, a lone stream (ms)"])
    joining = (median["TTFT p50 from the send, joining 15 running streams (ms)"]
               / median["TTFT p50 from the send, a lone stream (ms)"])
    return (markdown_table(rows) + f"\n\ncontinuous batching: {gain:.1f}x the tokens/s of one stream at a time; "
            f"TTFT p50 under 16 streams: {ttft:.2f}x a lone stream's from the client's call, {sent:.2f}x from the "
            f"request's send (16 sent at once); {joining:.2f}x for a stream that joins 15 running ones")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    args = parser.parse_args()
    print(render(run_interruptible(lambda: run(args.rounds)), args.rounds))


if __name__ == "__main__":
    main()
