"""Several gateway processes on one port (``--reuse-port``): how req/s at concurrency 64 scales with them.

What is measured
    One embedded platform serves bench/apps/per_call/per_call.py (echo, unbatched; the MLP batched). Beside its
    own control plane, ``--processes`` more are started, all with ``--reuse-port``: one alone on a port, and
    ``--processes - 1`` together on another (so that both sides are control planes started the same way, none
    of them the lease holder that runs the control loop). Each round measures both ports with http_latency.py's
    closed-loop client at concurrency 64 (64 connections, which the kernel spreads over the processes sharing a
    port), the order alternating; the table gives the medians, the ratio, and the CPU each gateway process took.
    On a host with few cores the load generator, nats-server and the replicas share them with the gateways: the
    ratio says what more gateway processes bring on this host, not on a bigger one.

Usage
    python bench/gateway_processes.py [--processes 2] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import http_latency  # noqa: E402  (bench/ is not a package)
from ab import start_control_plane  # noqa: E402
from batching import deploy_all, proc_cpu_s  # noqa: E402
from http_latency import Target, markdown_table, say, stop_process  # noqa: E402
from per_call import APP, APP_DIR, ECHO_BODY, load_average, mlp_bodies  # noqa: E402

from ember import _loop as ember_loop  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(args: argparse.Namespace, plan: http_latency.Plan) -> None:
    from ember.dev.embedded import EmbeddedPlatform

    work = Path(tempfile.mkdtemp(prefix="ember-bench-gateways-"))
    platform = EmbeddedPlatform(work / "state", http_port=0)
    started = []
    try:
        say(f"starting the platform in {platform.state_dir}")
        platform.start()
        os.environ["EMBER_TOKEN"] = platform.token
        deploy_all(platform.url, [APP_DIR / "per_call.py"])
        first = platform._procs["platform"]
        alone, shared = free_port(), free_port()
        sides: dict[str, tuple[str, list[int]]] = {}
        proc, url = start_control_plane(first, work, "alone", "--reuse-port", port=alone)
        started.append(proc)
        sides["1 process"] = (url, [proc.pid])
        pids = []
        for i in range(args.processes):
            proc, url = start_control_plane(first, work, f"shared-{i}", "--reuse-port", port=shared)
            started.append(proc)
            pids.append(proc.pid)
        sides[f"{args.processes} processes"] = (url, pids)
        functions = {"echo": [ECHO_BODY], "Batched.predict": mlp_bodies()}
        results: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[list[float]]] = {}
        load_before = load_average()

        async def rounds() -> None:
            for r in range(args.rounds):
                order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]
                for fn, bodies in functions.items():
                    for side, (url, side_pids) in order:
                        say(f"round {r + 1}/{args.rounds}: {fn}, {side}")
                        before, t0 = [proc_cpu_s(p) or 0.0 for p in side_pids], time.monotonic()
                        cell = await http_latency.measure(Target(side, f"{url}/v1/{APP}/{fn}", bodies, is_ember=True),
                                                          64, plan)
                        wall = time.monotonic() - t0
                        results.setdefault((fn, side), []).append(cell.rps)
                        cpu.setdefault((fn, side), []).append(
                            [((proc_cpu_s(p) or 0.0) - b) / wall for p, b in zip(side_pids, before, strict=True)])

        ember_loop.run(rounds())
        names = list(sides)
        rows = [["function", "processes", "req/s at c=64 (median)", "ratio to 1 process",
                 "CPU of each gateway process (cores, median)", "rounds"]]
        for fn in functions:
            base = statistics.median(results[(fn, names[0])])
            for side in names:
                rps = statistics.median(results[(fn, side)])
                per_proc = [statistics.median(c[i] for c in cpu[(fn, side)]) for i in range(len(cpu[(fn, side)][0]))]
                rows.append([fn, side, f"{rps:,.0f}", f"{rps / base:.2f}x", ", ".join(f"{c:.2f}" for c in per_proc),
                             ", ".join(f"{v:,.0f}" for v in results[(fn, side)])])
        print(f"## Gateway processes on one port ({os.cpu_count()} CPUs, load average {load_before} before, "
              f"{load_average()} after; {args.rounds} interleaved rounds, {plan.measure_s:g} s windows)\n")
        print(markdown_table(rows), flush=True)
    finally:
        say("stopping")
        for proc in started:
            stop_process(proc)
        platform.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="gateway processes sharing the second port")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="shorter windows")
    args = parser.parse_args()
    if args.processes < 2:
        parser.error("--processes: at least 2 (they are compared with one)")
    plan = (http_latency.Plan(warmup_s=0.3, measure_s=1.5, max_requests=10_000) if args.quick
            else http_latency.Plan(warmup_s=0.5, measure_s=3.0, max_requests=30_000))
    run(args, plan)


if __name__ == "__main__":
    main()
