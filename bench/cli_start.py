"""How long an ``ember`` command takes from the shell: the interpreter, the CLI's imports, one request and its output.

    python bench/cli_start.py [--repeats 15]

Starts the embedded platform, then runs ``ember --help`` (no request) and ``ember ls`` (one authenticated request),
each ``--repeats`` times in a fresh ``python -m ember.cli`` process, the two commands in turn; prints the median
and the fastest and slowest wall times. With ``bench/compare_commits.py A B --key-columns 1 -- bench/cli_start.py``
each side runs its own commit's CLI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_latency import markdown_table, say

from ember.dev.embedded import EmbeddedPlatform

COMMANDS = {"ember --help": ["--help"], "ember ls": ["ls"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="runs of each command (default 15)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ember-bench-cli-") as state, EmbeddedPlatform(Path(state)) as platform:
        env = {**os.environ, "EMBER_URL": platform.url, "EMBER_TOKEN": platform.token}
        times: dict[str, list[float]] = {name: [] for name in COMMANDS}
        say(f"{args.repeats} runs of each command")
        for _ in range(args.repeats):
            for name, argv in COMMANDS.items():
                started = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "ember.cli", *argv], env=env, capture_output=True,
                                      text=True, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed: {done.stderr}")
                times[name].append((time.perf_counter() - started) * 1000)
    rows = [["command", "median ms", "fastest ms", "slowest ms"]]
    rows += [[name, f"{statistics.median(t):.1f}", f"{min(t):.1f}", f"{max(t):.1f}"] for name, t in times.items()]
    print(f"## An ember command's wall time ({os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; median of {args.repeats})\n")
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
