"""Latency of calls during a rollout (``ember push`` of a new version) next to steady state.

What is measured
    A class model whose setup sleeps ``SETUP_S`` (so that a call that waited for a cold start would show it), one
    replica (``min_replicas=1``), called by a closed loop of ``CONCURRENCY`` workers. Rounds alternate two windows:

    * ``steady``   the loop alone, for ``WINDOW_S``;
    * ``rollout``  the loop while a new version is pushed (``ember.deploy``, which returns once the new version
                   takes the calls), then until the old version's replica has drained (and is kept warm).

    Reported per phase: calls, errors (any answer but 200), p50 / p95 / p99 / max latency over all of its rounds,
    and the median over rounds of each round's p99. The rollout's calls should look like steady ones: the new
    version takes calls only once ready, and the old one finishes what it holds before it stops.

    Then rollbacks, timed from ``ember.rollback`` to its return (it returns once the version takes every call):

    * ``within``   right after a push, while the version it replaced is still warm (``EMBER_KEEP_PREVIOUS_S``,
                   ``KEEP_S`` here): the traffic switches to its kept replicas;
    * ``after``    once the window passed and its replicas are gone: it starts again (interpreter, imports, setup).

How
    One run starts an ``EmbeddedPlatform`` (nats-server, control plane, node agent) in a temporary folder; this
    process is the load generator (httpx, one keep-alive connection per worker). Everything started is stopped on
    exit.

Usage
    python bench/rollout_latency.py [--rounds N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from ember._client import Transport
from ember._deploy import deploy, rollback
from ember.dev.embedded import EmbeddedPlatform

CONCURRENCY = 4
WINDOW_S = 8.0
SETUP_S = 2.0
KEEP_S = 15.0  # the platform's EMBER_KEEP_PREVIOUS_S: short, so that the rollbacks after it are quick to reach
SOURCE = '''import time
import ember

app = ember.App("rollbench")
VERSION = {version}


@app.model(min_replicas=1, max_replicas=1)
class M:
    @ember.setup
    def load(self) -> None:
        time.sleep({setup_s})

    @ember.method()
    def which(self, x: int) -> dict:
        return {{"version": VERSION, "x": x}}
'''


class Loop:
    """A closed loop of calls on its own thread and event loop; ``mark`` starts a new phase's record."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.phase = ""
        self.seen: dict[str, list[tuple[float, int]]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def mark(self, phase: str) -> None:
        self.seen.setdefault(phase, [])
        self.phase = phase

    async def _run(self) -> None:
        async def worker(i: int) -> None:
            headers = {"Authorization": f"Bearer {self.token}"}
            async with httpx.AsyncClient(base_url=self.url, headers=headers, timeout=60) as client:
                n = 0
                while not self.stop.is_set():
                    phase, started = self.phase, time.perf_counter()
                    try:
                        status = (await client.post("/v1/rollbench/M.which", json=n)).status_code
                    except httpx.HTTPError:
                        status = 0
                    if phase:
                        self.seen[phase].append((time.perf_counter() - started, status))
                    n += 1

        await asyncio.gather(*(worker(i) for i in range(CONCURRENCY)))


def _running(http: httpx.Client) -> set[int]:
    view = http.get("/v1/apps/rollbench").json()
    return {r["version"] for s in view["services"] for r in s["replicas"]}


def _drained(http: httpx.Client, version: int) -> bool:
    """Whether every version but ``version`` has stopped or is kept warm (what it held is done)."""
    others = [v for v in http.get("/v1/apps/rollbench").json()["versions"] if v["version"] != version]
    return all(v["state"] == "kept" or v["warm"] for v in others)


def _push(source: Path, version: int, transport: Transport) -> None:
    source.parent.mkdir(exist_ok=True)
    source.write_text(SOURCE.format(version=version, setup_s=SETUP_S))
    deploy(source, transport=transport, timeout_s=300)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 rounds")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="ember-rollbench-") as tmp:
        work = Path(tmp)
        os.environ["EMBER_KEEP_PREVIOUS_S"] = str(KEEP_S)  # the platform's processes inherit it
        platform = EmbeddedPlatform(work / "state", http_port=0)
        platform.start()
        try:
            _measure(platform, work, rounds)
            return _rollbacks(platform, work, rounds)
        finally:
            platform.stop()


def _measure(platform: EmbeddedPlatform, work: Path, rounds: int) -> int:
    transport = Transport(platform.url, token=platform.token)
    http = httpx.Client(base_url=platform.url, headers={"Authorization": f"Bearer {platform.token}"}, timeout=60)
    source = work / "app" / "rollbench.py"  # the app's folder is its bundle: not the platform's state
    version = 1
    _push(source, version, transport)
    loop = Loop(platform.url, platform.token)
    loop.thread.start()
    time.sleep(2.0)  # warm-up, not recorded
    per_round: dict[str, list[float]] = {"steady": [], "rollout": []}
    try:
        for r in range(rounds):
            loop.mark(f"steady-{r}")
            time.sleep(WINDOW_S)
            loop.mark(f"rollout-{r}")
            started = time.monotonic()
            version += 1
            _push(source, version, transport)
            switched = time.monotonic() - started
            while not _drained(http, version):
                time.sleep(0.2)
            print(f"round {r + 1}/{rounds}: v{version} took the calls {switched:.1f} s after the push, and v"
                  f"{version - 1} had drained (kept warm) {time.monotonic() - started:.1f} s after it",
                  file=sys.stderr, flush=True)
    finally:
        loop.mark("")
        loop.stop.set()
        loop.thread.join(timeout=70)
        http.close()
        transport.close()
    rows = []
    for phase in ("steady", "rollout"):
        calls = [c for key, seen in loop.seen.items() if key.startswith(phase + "-") for c in seen]
        for key, seen in loop.seen.items():
            if key.startswith(phase + "-") and len(seen) > 20:
                per_round[phase].append(_q([s[0] for s in seen], 99))
        latencies = [c[0] for c in calls]
        rows.append((phase, len(calls), sum(c[1] != 200 for c in calls), _q(latencies, 50), _q(latencies, 95),
                     _q(latencies, 99), max(latencies), statistics.median(per_round[phase])))
    print(f"rollout latency: {rounds} rounds, concurrency {CONCURRENCY}, replica setup {SETUP_S:.0f} s")
    print(f"{'phase':<8} {'calls':>7} {'errors':>6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'median round p99 ms':>20}")
    for phase, n, errors, p50, p95, p99, top, mp99 in rows:
        print(f"{phase:<8} {n:>7} {errors:>6} {p50 * 1e3:>8.1f} {p95 * 1e3:>8.1f} {p99 * 1e3:>8.1f} "
              f"{top * 1e3:>8.1f} {mp99 * 1e3:>20.1f}")
    return 0


def _rollbacks(platform: EmbeddedPlatform, work: Path, rounds: int) -> int:
    """Each round: a push, a rollback at once (within the window), a push, a rollback once the replaced version's
    replicas are gone (after it)."""
    transport = Transport(platform.url, token=platform.token)
    http = httpx.Client(base_url=platform.url, headers={"Authorization": f"Bearer {platform.token}"}, timeout=60)
    source = work / "app" / "rollbench.py"  # the app's folder is its bundle: not the platform's state
    taken: dict[str, list[float]] = {"within": [], "after": []}
    try:
        serving = latest = http.get("/v1/apps/rollbench").json()["version"]
        for r in range(rounds):
            for phase in ("within", "after"):
                latest += 1
                _push(source, latest, transport)  # ``serving`` leaves the traffic: warm for KEEP_S
                while phase == "after" and serving in _running(http):
                    time.sleep(0.2)
                started = time.monotonic()
                rollback("rollbench", to=serving, transport=transport, timeout_s=300)
                taken[phase].append(time.monotonic() - started)
                print(f"round {r + 1}/{rounds}: rollback {phase} the window took {taken[phase][-1]:.2f} s",
                      file=sys.stderr, flush=True)
    finally:
        http.close()
        transport.close()
    print(f"rollback: {rounds} rounds, EMBER_KEEP_PREVIOUS_S={KEEP_S:g}, replica setup {SETUP_S:.0f} s; seconds "
          "from ember.rollback to its return (the version takes every call)")
    print(f"{'phase':<8} {'rounds':>7} {'median s':>9} {'min s':>7} {'max s':>7}")
    for phase, values in taken.items():
        print(f"{phase:<8} {len(values):>7} {statistics.median(values):>9.2f} {min(values):>7.2f} {max(values):>7.2f}")
    return 0


def _q(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


if __name__ == "__main__":
    sys.exit(main())
