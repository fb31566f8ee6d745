"""What a call between functions costs: a function that calls another over its replica's NATS connection (through a
control plane's relay), against calling the other function straight from the client, in the same run.

What is measured, through one embedded platform (tests/apps/calling: ``fn-callee.echo`` and
``fn-caller.Caller.relay``, which calls ``fn-callee.echo`` with ``.remote()`` and returns its answer):

    * ``direct``: ``POST /v1/fn-callee/echo``, one HTTP call, one replica;
    * ``nested``: ``POST /v1/fn-caller/Caller.relay``, one HTTP call whose function makes one inner call, the
      blocking way, on its one model thread;
    * ``nested, async``: ``POST /v1/fn-caller/in_async`` (``{"seconds": 0}``), an ``async def`` function with
      ``max_concurrency=8`` that awaits one inner call (``fn-callee.nap(0)``, also async) on its event loop;

p50 and p99 at concurrency 1 and requests/s at 16 (the load generator of ``bench/http_latency.py``), in rounds
that rotate which goes first; medians over the rounds. ``nested - direct`` is what the inner call adds: the
relay request and its answer over NATS, the control plane's checks, and the second replica's turn.

Usage
    python bench/inner_calls.py [--rounds N] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from http_latency import FULL, QUICK, ROOT, Plan, Target, markdown_table, measure, run_interruptible, say  # noqa: E402

from ember import _loop as ember_loop  # noqa: E402

APPS = ROOT / "tests" / "apps" / "calling"
SIDES = ("direct", "nested", "nested, async")


def run(rounds: int, plan: Plan) -> dict[str, list[float]]:
    import ember
    from ember._client import Transport
    from ember.dev.embedded import EmbeddedPlatform

    work = Path(tempfile.mkdtemp(prefix="ember-inner-bench-"))
    platform = EmbeddedPlatform(work / "state", http_port=0)
    results: dict[str, list[float]] = {f"{m} {side}": [] for m in ("p50", "p99", "rps", "errors") for side in SIDES}
    try:
        platform.start()
        transport = Transport(platform.url, token=platform.token)
        for name in ("callee", "caller"):
            say(f"deploying {name}")
            ember.deploy(APPS / f"{name}.py", transport=transport, timeout_s=180)
        transport.close()
        targets = {"direct": Target("fn-callee.echo", f"{platform.url}/v1/fn-callee/echo", [b"7"], is_ember=True,
                                    token=platform.token),
                   "nested": Target("fn-caller.Caller.relay", f"{platform.url}/v1/fn-caller/Caller.relay", [b"7"],
                                    is_ember=True, token=platform.token),
                   "nested, async": Target("fn-caller.in_async", f"{platform.url}/v1/fn-caller/in_async",
                                           [b'{"seconds": 0}'], is_ember=True, token=platform.token)}

        async def rounds_() -> None:
            for r in range(rounds):
                for side in SIDES[r % len(SIDES):] + SIDES[:r % len(SIDES)]:
                    say(f"round {r + 1}/{rounds}: {side}")
                    one, many = await measure(targets[side], 1, plan), await measure(targets[side], 16, plan)
                    results[f"p50 {side}"].append(one.percentile(50))
                    results[f"p99 {side}"].append(one.percentile(99))
                    results[f"rps {side}"].append(many.rps)
                    results[f"errors {side}"].append(one.errors + many.errors)

        ember_loop.run(rounds_())
    finally:
        platform.stop()
        shutil.rmtree(work, ignore_errors=True)
    return results


def render(results: dict[str, list[float]], rounds: int) -> str:
    med = {k: statistics.median(v) for k, v in results.items()}
    rows = [[f"median of {rounds} rounds", "direct (client -> echo)", "nested (client -> Caller.relay -> echo)",
             "nested, async (client -> in_async -> nap)", "nested - direct"]]
    for metric, label, fmt in (("p50", "p50 at concurrency 1 (ms)", "{:.3f}"),
                               ("p99", "p99 at concurrency 1 (ms)", "{:.3f}"),
                               ("rps", "req/s at concurrency 16", "{:,.0f}")):
        a, b, c = (med[f"{metric} {side}"] for side in SIDES)
        rows.append([label, fmt.format(a), fmt.format(b), fmt.format(c),
                     ("{:+.3f}" if metric != "rps" else "{:+,.0f}").format(b - a)])
    rows.append(["answers that were errors, all rounds", *(f"{sum(results[f'errors {side}']):.0f}" for side in SIDES),
                 "-"])
    return markdown_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="shorter windows, for a smoke run")
    args = parser.parse_args()
    print(render(run_interruptible(lambda: run(args.rounds, QUICK if args.quick else FULL)), args.rounds))


if __name__ == "__main__":
    main()
