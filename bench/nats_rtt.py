"""The NATS hop alone: a bare request/reply round trip between two Python processes through nats-server.

What is measured
    A synchronous call through Ember crosses nats-server twice (gateway -> replica, replica -> gateway), between two
    Python processes on uvloop with nats-py, as this benchmark's two processes do: a responder that publishes each
    message back to its reply subject, and a caller that sends one message at a time (concurrency 1) to it and
    waits for the answer on its own inbox (as the gateway waits on its answers' inbox). Nothing else: no HTTP, no
    frames, no batching. Its p50 is the part of Ember's p50 at concurrency 1 that the NATS hop itself takes on
    this host, which ``per_call.py``'s gap to the floor cannot be below. One fresh nats-server (no JetStream, no
    auth); ``--rounds`` windows of ``--calls`` calls after a warm-up; medians.

Usage
    python bench/nats_rtt.py [--rounds 3] [--calls 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from http_latency import markdown_table, stop_process  # noqa: E402

BODY = b'{"message":"hello","n":42}'


async def respond(url: str) -> None:
    import nats

    nc = await nats.connect(url)

    async def echo(msg) -> None:  # type: ignore[no-untyped-def]
        await nc.publish(msg.reply, msg.data)

    await nc.subscribe("rtt.echo", cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()


async def call(url: str, rounds: int, calls: int) -> list[tuple[float, float]]:
    import nats

    nc = await nats.connect(url)
    loop = asyncio.get_running_loop()
    inbox = nc.new_inbox()
    waiting: list[asyncio.Future[bytes]] = []

    async def answered(msg) -> None:  # type: ignore[no-untyped-def]
        waiting.pop().set_result(msg.data)

    await nc.subscribe(inbox, cb=answered)
    out = []
    for r in range(rounds + 1):  # the first round warms up
        times = []
        for _ in range(calls):
            future = loop.create_future()
            waiting.append(future)
            started = time.perf_counter()
            await nc.publish("rtt.echo", BODY, reply=inbox)
            await future
            times.append(time.perf_counter() - started)
        times.sort()
        if r:
            out.append((1000 * times[len(times) // 2], 1000 * times[int(len(times) * 0.99)]))
    await nc.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--respond", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import uvloop

    if args.respond:
        uvloop.run(respond(args.respond))
        return
    from ember._procs import die_with_parent
    from ember.dev.embedded import nats_server_binary

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    url = f"nats://127.0.0.1:{port}"
    store = tempfile.mkdtemp(prefix="ember-bench-rtt-")
    server = subprocess.Popen([nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-sd", store],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
    responder = None
    try:
        time.sleep(0.5)
        responder = subprocess.Popen([sys.executable, __file__, "--respond", url], stdout=subprocess.PIPE,
                                     preexec_fn=die_with_parent)
        assert responder.stdout is not None
        responder.stdout.readline()  # "ready"
        results = uvloop.run(call(url, args.rounds, args.calls))
    finally:
        for proc in (responder, server):
            if proc is not None:
                stop_process(proc)
    rows = [["measure", "median", "rounds"],
            ["p50 round trip, ms", f"{statistics.median(r[0] for r in results):.3f}",
             ", ".join(f"{r[0]:.3f}" for r in results)],
            ["p99 round trip, ms", f"{statistics.median(r[1] for r in results):.3f}",
             ", ".join(f"{r[1]:.3f}" for r in results)]]
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"]
    print(f"## A bare nats-py request/reply through nats-server, concurrency 1 ({os.cpu_count()} CPUs, load average "
          f"{' '.join(load)}; {args.rounds} rounds of {args.calls:,} calls)\n")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
