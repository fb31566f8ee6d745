"""What the A/B benchmarks of the call path share: another control plane started like the platform's first one
(with other flags or environment), and rounds that measure two targets interleaved, in alternating order.

Used by ``auth_cost.py`` (tokens checked or not), ``metrics_cost.py`` (metrics counted or not) and
``tracing_cost.py`` (calls traced or not), which print their results with ``ab_table``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from http_latency import Plan, Target, markdown_table, measure, say

from ember import _loop as ember_loop


def start_control_plane(first: subprocess.Popen[bytes], work: Path, name: str, *flags: str,
                        env: Mapping[str, str] | None = None, port: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    """Another control plane, started as ``first`` was (same NATS and settings) but on ``port`` (0: a free one),
    without the first's ``--bootstrap-token-file`` and with ``flags`` (and ``env`` over this process's environment)
    added; it and its URL."""
    from ember._procs import die_with_parent

    args = [str(a) for a in first.args]  # type: ignore[union-attr]
    for flag in ("--port", "--url-file", "--bootstrap-token-file"):
        if flag in args:
            at = args.index(flag)
            del args[at:at + 2]
    url_file = work / f"{name}.url"
    log = (work / f"{name}.log").open("ab")
    proc = subprocess.Popen([*args, "--port", str(port), "--url-file", str(url_file), *flags], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
                            env={**os.environ, **(env or {})})
    log.close()
    deadline = time.monotonic() + 60
    while not url_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"control plane {name} did not start; see {work / (name + '.log')}")
        time.sleep(0.05)
    return proc, url_file.read_text()


def measure_rounds(on: Target, off: Target, rounds: int, plan: Plan, what: str = "") -> dict[str, list[float]]:
    """``rounds`` interleaved rounds (the order alternates): p50 at concurrency 1 (ms) and req/s at 64 for each
    side, under the keys ``p50 on``, ``p50 off``, ``rps on``, ``rps off``, ``errors on``, ``errors off``."""
    results: dict[str, list[float]] = {"p50 on": [], "p50 off": [], "rps on": [], "rps off": [], "errors on": [],
                                       "errors off": []}

    async def run() -> None:
        for r in range(rounds):
            order = [(on, "on"), (off, "off")]
            for target, side in order if r % 2 == 0 else order[::-1]:
                say(f"round {r + 1}/{rounds}: {what} {side}".replace("  ", " "))
                one, many = await measure(target, 1, plan), await measure(target, 64, plan)
                results[f"p50 {side}"].append(one.percentile(50))
                results[f"rps {side}"].append(many.rps)
                results[f"errors {side}"].append(one.errors + many.errors)

    ember_loop.run(run())
    return results


def ab_table(results: dict[str, list[float]], rounds: int, on_label: str, off_label: str,
             before: Sequence[list[str]] = (), after: Sequence[list[str]] = ()) -> str:
    """The medians of ``measure_rounds``' results as a table (``before`` and ``after``: more rows of five cells
    around them), then the rounds one by one."""
    med = {k: statistics.median(v) for k, v in results.items()}
    rows = [["measure", on_label, off_label, "difference", "ratio"], *before,
            [f"p50 at concurrency 1 (ms), median of {rounds}", f"{med['p50 on']:.3f}", f"{med['p50 off']:.3f}",
             f"{med['p50 on'] - med['p50 off']:+.3f}", f"{med['p50 on'] / med['p50 off']:.3f}x"],
            [f"req/s at concurrency 64, median of {rounds}", f"{med['rps on']:,.0f}", f"{med['rps off']:,.0f}",
             f"{med['rps on'] - med['rps off']:+,.0f}", f"{med['rps on'] / med['rps off']:.3f}x"],
            ["answers that were errors, all rounds", f"{sum(results['errors on']):.0f}",
             f"{sum(results['errors off']):.0f}", "-", "-"], *after]
    per_round = [["round", "p50 on", "p50 off", "req/s on", "req/s off"]] + [
        [str(i + 1), f"{results['p50 on'][i]:.3f}", f"{results['p50 off'][i]:.3f}", f"{results['rps on'][i]:,.0f}",
         f"{results['rps off'][i]:,.0f}"] for i in range(rounds)]
    return markdown_table(rows) + "\n\n" + markdown_table(per_round)
