"""The cost of metrics on the call path: the same calls through a control plane that counts them
(``ember_requests_total`` and ``ember_request_duration_seconds``) and through one that does not
(``EMBER_CALL_METRICS=off``), in the same run.

What is measured
    * the counting itself, in this process: ``CallMetrics.record`` (a counter and a histogram observation, label
      children cached), the work the gateway adds to every call (microseconds per call);
    * one scrape of ``GET /metrics`` (the platform's state read at scrape time, plus the counters), which is off
      the call path (milliseconds);
    * ``hello.echo`` over HTTP (examples/hello/hello.py) through each of the two control planes: p50 latency at
      concurrency 1 and requests/s at concurrency 64, the load generator of ``bench/http_latency.py``.

How
    One ``EmbeddedPlatform`` and two more control planes on its NATS (``ab.start_control_plane``), both with
    ``--insecure-no-auth`` on loopback so that only the metrics differ, and both standbys of the control loop; the
    same replicas answer both. Rounds alternate the two in alternating order (``ab.measure_rounds``); the table
    gives each one's median over the rounds and their ratio. ``--same`` counts on both sides (an A/A run: the
    resolution of the comparison on this machine).

Usage
    python bench/metrics_cost.py [--rounds N] [--quick] [--same]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from ab import ab_table, measure_rounds, start_control_plane  # noqa: E402  (bench/ is not a package)
from http_latency import FULL, QUICK, Plan, Target, deploy_examples, run_interruptible, say, stop_process  # noqa: E402

ECHO_BODY = [json.dumps({"message": "hello", "n": 42}).encode()]
RECORDS = 200_000


def record_cost_us() -> float:
    """Microseconds per counted call (``CallMetrics.record``), best of 5, in this process."""
    from ember_platform.metrics.calls import CallMetrics

    metrics = CallMetrics()
    for app in range(20):  # a registry with some functions in it already
        metrics.record(f"app{app}", "f", 1, 200, 0.01)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(RECORDS):
            metrics.record("hello", "echo", 1, 200, 0.0021)
        best = min(best, (time.perf_counter() - started) / RECORDS * 1e6)
    return best


def scrape_ms(url: str, token: str) -> float:
    """Median time of 20 scrapes of ``GET /metrics``."""
    import httpx

    times = []
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        for _ in range(20):
            started = time.perf_counter()
            http.get(f"{url}/metrics").raise_for_status()
            times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def render(results: dict[str, list[float]], record_us: float, scrape: float, rounds: int, same: bool) -> str:
    counting = ["counting one call, in process (us)", f"{record_us:.2f}", f"{record_us:.2f}" if same else "0",
                "0" if same else f"{record_us:+.2f}", "-"]
    scraping = ["one GET /metrics scrape, off the call path (ms, median of 20)", f"{scrape:.2f}", "-", "-", "-"]
    return ab_table(results, rounds, "metrics on", "metrics on (A/A)" if same else "metrics off",
                    before=[counting], after=[scraping])


def run(rounds: int, plan: Plan, same: bool) -> None:
    from ember.dev.embedded import EmbeddedPlatform

    work = Path(tempfile.mkdtemp(prefix="ember-metrics-bench-"))
    platform = EmbeddedPlatform(work / "state", http_port=0)
    planes: list[subprocess.Popen[bytes]] = []
    keep = False
    try:
        say("counting alone")
        record_us = record_cost_us()
        say(f"starting the platform in {work}")
        platform.start()
        deploy_examples(platform.url, platform.token, ("examples/hello/hello.py",))
        first = platform._procs["platform"]
        on, on_url = start_control_plane(first, work, "counted", "--insecure-no-auth")
        off, off_url = start_control_plane(first, work, "uncounted", "--insecure-no-auth",
                                           env={} if same else {"EMBER_CALL_METRICS": "off"})
        planes += [on, off]
        counted = Target("metrics on", f"{on_url}/v1/hello/echo", ECHO_BODY, is_ember=True)
        uncounted = Target("metrics off", f"{off_url}/v1/hello/echo", ECHO_BODY, is_ember=True)
        results = measure_rounds(counted, uncounted, rounds, plan, "metrics")
        print(render(results, record_us, scrape_ms(platform.url, platform.token), rounds, same))
    except Exception:
        keep = True
        raise
    finally:
        say("stopping")
        for proc in planes:
            stop_process(proc)
        platform.stop()
        if keep:
            say(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of both (default 5)")
    parser.add_argument("--quick", action="store_true", help="shorter windows, for a smoke run")
    parser.add_argument("--same", action="store_true", help="an A/A run: both control planes count calls")
    args = parser.parse_args()
    run_interruptible(lambda: run(args.rounds, QUICK if args.quick else FULL, args.same))


if __name__ == "__main__":
    main()
