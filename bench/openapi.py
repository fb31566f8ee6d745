"""What GET /openapi.json costs once the document is built, next to GET /healthz on the same control plane.

What is measured
    The control plane builds the OpenAPI document of the deployed apps on the first request and then serves it from
    memory until a deployment changes. One ``EmbeddedPlatform`` in a temporary state dir, with examples/hello
    deployed; one keep-alive HTTP client; the first GET of the document (its build), then ``--rounds`` rounds of
    ``--calls`` GETs of each path after a warm-up. Printed: the first GET, and the medians over rounds of each
    round's p50 and p95 in ms (the test suite checks only that the document is right; its speed is measured here).

Usage
    python bench/openapi.py [--rounds 5] [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from http_latency import markdown_table  # noqa: E402

from ember._client import Transport  # noqa: E402
from ember._deploy import deploy  # noqa: E402
from ember.dev.embedded import EmbeddedPlatform  # noqa: E402


def _window(http: httpx.Client, path: str, calls: int) -> tuple[float, float]:
    """p50 and p95 in ms of ``calls`` GETs of ``path``, one after the other."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        http.get(path).raise_for_status()
        times.append(time.perf_counter() - started)
    times.sort()
    return 1000 * times[len(times) // 2], 1000 * times[int(len(times) * 0.95)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state, EmbeddedPlatform(Path(state)) as platform:
        transport = Transport(platform.url, token=platform.token)
        deploy(REPO / "examples" / "hello" / "hello.py", transport=transport, timeout_s=120)
        with httpx.Client(base_url=platform.url, headers={"Authorization": f"Bearer {platform.token}"},
                          timeout=30) as http:
            started = time.perf_counter()
            http.get("/openapi.json").raise_for_status()
            first_ms = 1000 * (time.perf_counter() - started)
            rows = [["GET", "p50 ms", "p95 ms"]]
            for path in ("/openapi.json", "/healthz"):
                _window(http, path, args.calls)  # warm-up
                windows = [_window(http, path, args.calls) for _ in range(args.rounds)]
                rows.append([path, f"{statistics.median(w[0] for w in windows):.2f}",
                             f"{statistics.median(w[1] for w in windows):.2f}"])
        transport.close()
    print(f"first GET /openapi.json (the build): {first_ms:.1f} ms")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
