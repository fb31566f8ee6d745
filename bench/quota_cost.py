"""The cost of quotas on the call path: the same calls with and without a quota that applies, in the same run.

What is measured
    * the admission itself, in this process: ``Limiter.admit`` and the release of its hold, the work the gateway
      adds to every call, with no quota, with a quota on calls of another app (the memo says none applies), and
      with a rate and concurrency quota that applies (microseconds per call); rounds interleaved, medians;
    * unless ``--no-http``: ``hello.echo`` over HTTP (examples/hello/hello.py) through one embedded platform, p50 at
      concurrency 1 and requests/s at 64 (the load generator of ``bench/http_latency.py``), in rounds that
      alternate no quota and a quota on ``hello`` too generous to refuse anything (1,000,000 calls/s, burst
      1,000,000, 100,000 in flight), set and removed through ``/v1/quotas`` between rounds, in alternating order.

Usage
    python bench/quota_cost.py [--rounds N] [--quick] [--no-http]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from http_latency import FULL, QUICK, Plan, Target, deploy_examples, markdown_table, measure, run_interruptible, say  # noqa: E402

from ember import _loop as ember_loop  # noqa: E402
from ember.wire import Quota  # noqa: E402
from ember_platform.quotas.limiter import Limiter  # noqa: E402

ECHO_BODY = [json.dumps({"message": "hello", "n": 42}).encode()]
CALLS = 200_000
GENEROUS = {"apps": "hello", "rate_per_s": 1_000_000.0, "burst": 1_000_000, "max_concurrent_calls": 100_000}
CASES = {
    "no quota": [],
    "a quota on another app": [Quota(name="other", apps="team-b-*", rate_per_s=10.0, max_concurrent_calls=5)],
    "a rate and concurrency quota that applies": [Quota(name="q", apps="hello", rate_per_s=1e9, burst=10**9,
                                                        max_concurrent_calls=10**9)],
}


def admit_cost_us(quotas: list[Quota]) -> float:
    """Microseconds per admitted call (admit, then release the hold), best of 3 loops of ``CALLS``."""
    limiter = Limiter()
    limiter.set(quotas)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(CALLS):
            held = limiter.admit("hello", "0a1b2c3d4e5f")
            if held is not None:
                held.release()
        best = min(best, (time.perf_counter() - started) / CALLS * 1e6)
    return best


def in_process(rounds: int) -> dict[str, list[float]]:
    costs: dict[str, list[float]] = {name: [] for name in CASES}
    for r in range(rounds):
        names = list(CASES) if r % 2 == 0 else list(CASES)[::-1]
        for name in names:
            costs[name].append(admit_cost_us(CASES[name]))
    return costs


def over_http(rounds: int, plan: Plan) -> dict[str, list[float]]:
    import httpx

    from ember.dev.embedded import EmbeddedPlatform

    work = Path(tempfile.mkdtemp(prefix="ember-quota-bench-"))
    platform = EmbeddedPlatform(work / "state", http_port=0)
    results: dict[str, list[float]] = {f"{m} {side}": [] for m in ("p50", "rps", "errors") for side in ("on", "off")}
    try:
        platform.start()
        deploy_examples(platform.url, platform.token, ("examples/hello/hello.py",))
        admin = httpx.Client(base_url=platform.url, headers={"Authorization": f"Bearer {platform.token}"}, timeout=30)
        target = Target("hello.echo", f"{platform.url}/v1/hello/echo", ECHO_BODY, is_ember=True, token=platform.token)

        async def run() -> None:
            for r in range(rounds):
                for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
                    if side == "on":
                        admin.put("/v1/quotas/bench", json=GENEROUS).raise_for_status()
                    else:
                        admin.delete("/v1/quotas/bench")
                    say(f"round {r + 1}/{rounds}: quota {side}")
                    one, many = await measure(target, 1, plan), await measure(target, 64, plan)
                    results[f"p50 {side}"].append(one.percentile(50))
                    results[f"rps {side}"].append(many.rps)
                    results[f"errors {side}"].append(one.errors + many.errors)

        ember_loop.run(run())
        admin.close()
    finally:
        platform.stop()
        shutil.rmtree(work, ignore_errors=True)
    return results


def render(costs: dict[str, list[float]], http: dict[str, list[float]] | None, rounds: int) -> str:
    base = statistics.median(costs["no quota"])
    rows = [[f"admission, in process (µs per call, median of {rounds})", "µs", "added to no quota"]]
    rows += [[name, f"{statistics.median(v):.3f}", f"{statistics.median(v) - base:+.3f}"] for name, v in costs.items()]
    out = markdown_table(rows)
    if http is not None:
        med = {k: statistics.median(v) for k, v in http.items()}
        out += "\n\n" + markdown_table([
            [f"over HTTP, median of {rounds} rounds", "quota applies", "no quota", "difference", "ratio"],
            ["p50 at concurrency 1 (ms)", f"{med['p50 on']:.3f}", f"{med['p50 off']:.3f}",
             f"{med['p50 on'] - med['p50 off']:+.3f}", f"{med['p50 on'] / med['p50 off']:.3f}x"],
            ["req/s at concurrency 64", f"{med['rps on']:,.0f}", f"{med['rps off']:,.0f}",
             f"{med['rps on'] - med['rps off']:+,.0f}", f"{med['rps on'] / med['rps off']:.3f}x"],
            ["answers that were errors, all rounds", f"{sum(http['errors on']):.0f}",
             f"{sum(http['errors off']):.0f}", "-", "-"]])
        out += "\n\n" + markdown_table([["round", "p50 on", "p50 off", "req/s on", "req/s off"]] + [
            [str(i + 1), f"{http['p50 on'][i]:.3f}", f"{http['p50 off'][i]:.3f}", f"{http['rps on'][i]:,.0f}",
             f"{http['rps off'][i]:,.0f}"] for i in range(rounds)])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="shorter HTTP windows, for a smoke run")
    parser.add_argument("--no-http", action="store_true", help="only the in-process admission")
    args = parser.parse_args()
    say("admission in process")
    costs = run_interruptible(lambda: in_process(args.rounds))
    http = None if args.no_http else run_interruptible(lambda: over_http(args.rounds, QUICK if args.quick else FULL))
    print(render(costs, http, args.rounds))


if __name__ == "__main__":
    main()
