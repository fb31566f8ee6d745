"""Two commits side by side on one benchmark: runs interleaved, medians, ratios.

What it does
    Checks both commits out into temporary git worktrees, then runs the benchmark script of each in turn
    (A, B, A, B, ...) with ``PYTHONPATH`` pointing at that worktree's source roots, so that the benchmark and
    every process it starts (control plane, agent, replicas) run that commit's code in this checkout's
    environment. Every run prints a markdown table (as the scripts in bench/ do); the rows are matched by
    their first two columns and each numeric column's median over the runs is reported for A and B, with
    the ratio B / A.

    A cell's number is its leading figure (``9,269``, ``0.47x``, ``+0.80 ms``). Rows are matched by their first
    ``--key-columns`` cells (2 by default: http_latency.py's target and concurrency; 1 for per_call.py, whose
    first column names the cell and whose others are all figures).

Usage
    python bench/compare_commits.py A B [--runs 5] [--columns "req/s,p50 ms"] [--key-columns 2] \
        -- bench/http_latency.py --quick
    python bench/compare_commits.py A B --columns "Ember,ratio / gap" --key-columns 1 -- bench/per_call.py --rounds 1
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("sdk", "platform", "runtime")

Row = tuple[str, ...]
FIGURE = re.compile(r"[-+]?(?:\d[\d,]*)?\.?\d+")


def parse_tables(text: str, key_columns: int = 2) -> dict[Row, dict[str, float]]:
    """The numeric cells of every markdown table row, by its first ``key_columns`` cells and header name."""
    rows: dict[Row, dict[str, float]] = {}
    header: list[str] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header:
            header = cells
        elif not set(cells[0]) <= set("-: ") and len(cells) == len(header):
            values = {}
            for name, cell in zip(header[key_columns:], cells[key_columns:], strict=True):
                if figure := FIGURE.match(cell):
                    values[name] = float(figure.group().replace(",", ""))
            rows[tuple(cells[:key_columns])] = values
    return rows


def run_once(tree: Path, command: list[str], key_columns: int) -> dict[Row, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / root) for root in SOURCE_ROOTS)}
    proc = subprocess.run([sys.executable, *command], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=1800, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{command} failed in {tree}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return parse_tables(proc.stdout, key_columns)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--columns", default="req/s,p50 ms")
    parser.add_argument("--key-columns", type=int, default=2, help="leading cells that name a row (default 2)")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    if not command:
        parser.error("give the benchmark after --, e.g. -- bench/http_latency.py --quick")
    columns = [c.strip() for c in args.columns.split(",")]
    seen: dict[str, dict[Row, dict[str, list[float]]]] = {"A": defaultdict(lambda: defaultdict(list)),
                                                            "B": defaultdict(lambda: defaultdict(list))}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"A": Path(tmp, "a"), "B": Path(tmp, "b")}
        for side, rev in (("A", args.a), ("B", args.b)):
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(trees[side]), rev],
                           check=True)
            # bytecode, as an installed checkout has it: without it (PYTHONDONTWRITEBYTECODE, or a read-only
            # sandbox) every fresh interpreter, a cold replica's included, would compile Ember's modules again
            subprocess.run([sys.executable, "-m", "compileall", "-q", *(str(trees[side] / r) for r in SOURCE_ROOTS)],
                           check=True, stdout=subprocess.DEVNULL)
        try:
            for i in range(args.runs):
                for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                    print(f"[compare] run {i + 1}/{args.runs}: {side}", file=sys.stderr, flush=True)
                    for row, values in run_once(trees[side], command, args.key_columns).items():
                        for name, value in values.items():
                            seen[side][row][name].append(value)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    print(f"A = {args.a}, B = {args.b}; medians of {args.runs} interleaved runs of {' '.join(command)}\n")
    head = ["row"] + [f"{c} {s}" for c in columns for s in ("A", "B", "B/A")]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in [*seen["A"], *(r for r in seen["B"] if r not in seen["A"])]:  # B's new rows (a new kind) too
        cells = [" ".join(row)]
        for column in columns:
            a, b = (statistics.median(seen[s][row][column]) if seen[s][row][column] else None for s in ("A", "B"))
            cells += [f"{a:,.2f}" if a is not None else "-", f"{b:,.2f}" if b is not None else "-",
                      f"{b / a:.2f}" if a and b is not None else "-"]
        if cells[1:] == ["-"] * (len(cells) - 1):
            continue  # a row of another table, without these columns
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
