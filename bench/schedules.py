"""Schedule lag and the schedule loop's cost with 1,000 scheduled functions on one platform.

A platform starts (``EmbeddedPlatform``); 10 apps of 100 functions each, every one on ``ember.Period(seconds=2)``, are
handed to a ``ScheduleLoop`` connected to that platform's NATS as a control plane (the loop is the platform's own
code; the deployments are given to it in memory, so that no 1,000 replicas are needed). For ``ROUNDS`` periods the
loop fires every tick onto the durable queue (a call record and a JetStream publish each, deduplicated by
``<app>.<fn>.<tick ms>``). Figures: the lag from a tick to its call queued (p50/p99), and the loop's pass cost, the
pass at a tick (1,000 calls queued) and the passes between ticks (nothing due). A replica starts a queued call
within its pull (bench/queues.py measures that path): tick -> start is this lag plus that.

    python bench/schedules.py
"""

from __future__ import annotations

import asyncio
import math
import platform as host
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from ember._deploy import inspect_app
from ember.dev.embedded import EmbeddedPlatform
from ember.wire import Deployment
from ember.wire.jetstream import Stores, connect, ensure_buckets
from ember_platform.calls.durable import Calls
from ember_platform.control.schedules import ScheduleLoop

APPS, PER_APP, PERIOD_S, ROUNDS = 10, 100, 2.0, 5
GOALS = "goals: lag p99 <= 200 ms, loop pass <= 5 ms"


class TimedCalls(Calls):
    """The platform's calls, noting when each tick's call was queued."""

    queued: dict[str, float] = {}

    async def submit(self, app, function, body, **kwargs):  # type: ignore[no-untyped-def, override]
        reply = await super().submit(app, function, body, **kwargs)
        if kwargs.get("msg_id"):
            self.queued[kwargs["msg_id"]] = time.time()
        return reply


def deployments(work: Path) -> dict[str, Deployment]:
    """The manifests of ``APPS`` modules of ``PER_APP`` scheduled functions, as ``ember push`` reads them."""
    out = {}
    for a in range(APPS):
        app = f"sched-{a}"
        source = [f"import ember\napp = ember.App({app!r})\n"]
        source += [f"@app.function(schedule=ember.Period(seconds={PERIOD_S}))\ndef f{i}() -> None: ...\n"
                   for i in range(PER_APP)]
        path = work / f"sched_{a}.py"
        path.write_text("\n".join(source))
        out[app] = Deployment(app=app, version=1, bundle_sha256="0" * 64, created_at=time.time(),
                              manifest=inspect_app(path))
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


async def run(nats_url: str, creds: object, work: Path) -> None:
    nc = await connect(nats_url, "bench-schedules", creds)  # type: ignore[arg-type]
    stores: Stores = await ensure_buckets(nc.jetstream())
    calls = TimedCalls(nc, stores, 30.0)
    loop = ScheduleLoop(nc.jetstream(), calls, SimpleNamespace(items=deployments(work)), active=lambda: True)  # type: ignore[arg-type]
    await loop.start()
    first = math.floor(time.time() / PERIOD_S) * PERIOD_S + PERIOD_S
    await asyncio.sleep(first + ROUNDS * PERIOD_S + 1.0 - time.time())
    await loop.stop()
    lags = [1000 * (at - int(msg_id.rsplit(".", 1)[1]) / 1000) for msg_id, at in calls.queued.items()]
    passes = [1000 * s for s in loop.pass_s]
    busy = [p for p in passes if p > statistics.median(passes) * 5] or passes
    rows = [("scheduled functions", f"{APPS * PER_APP}"), ("ticks fired", f"{len(lags)}"),
            ("lag tick -> queued p50 (ms)", f"{pct(lags, 0.5):.1f}"),
            ("lag tick -> queued p99 (ms)", f"{pct(lags, 0.99):.1f}"),
            ("loop pass, nothing due p50 (ms)", f"{statistics.median(passes):.2f}"),
            ("loop pass, nothing due p99 (ms)", f"{pct(passes, 0.99):.2f}"),
            ("loop pass at a tick (1,000 queued) mean (ms)", f"{statistics.mean(busy):.1f}")]
    width = max(len(r[0]) for r in rows)
    print(f"{host.node()} {host.machine()} python {sys.version.split()[0]} {time.strftime('%Y-%m-%d')}; {GOALS}")
    for name, value in rows:
        print(f"{name.ljust(width)}  {value:>10}")
    await nc.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as work, EmbeddedPlatform(Path(work) / "state", http_port=0) as platform:
        asyncio.run(run(platform.nats_url, platform.nats_credentials, Path(work)))


if __name__ == "__main__":
    main()
