"""Schedule lag and the schedule loop's cost with 1,000 scheduled functions.

What runs
    A fresh nats-server with JetStream, Ember's buckets and streams (``ensure_buckets``), and the control plane's own
    ``ScheduleLoop`` holding the lease, with 10 apps of 100 functions each, every one on ``ember.Period(seconds=2)``
    (``--overlap``, "skip" by default). The deployments are given to the loop in memory, so that no 1,000 replicas
    are needed; a full platform is not started because its own loop, holding the lease, would forget the keys of
    functions it has not deployed. A second process stands in for the replicas: it pulls the queued calls from the
    durable queue, marks each running (as a replica does: its status record, which the loop's watch reads) and
    stores its final record at once, so that every tick's previous run has ended and, with ``overlap="skip"``,
    every tick fires.

Figures
    lag tick -> queued: from the tick to the call's publish acknowledged (the loop's side); lag tick -> start: from
    the tick to the stand-in replica marking the call running (what ``ember_schedule_lag_seconds`` observes, the
    queue's pull included); the loop's pass: a pass with nothing due, and a pass at a tick (every function due).

    python bench/schedules.py [--overlap skip|queue|allow] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from http_latency import markdown_table, stop_process  # noqa: E402

from ember._deploy import inspect_app  # noqa: E402
from ember._loop import run as run_loop  # noqa: E402
from ember.dev.embedded import nats_server_binary  # noqa: E402
from ember.wire import CallRecord, Deployment, subjects  # noqa: E402
from ember.wire.callstore import CallStore, final  # noqa: E402
from ember.wire.headers import CALL_ID_HEADER  # noqa: E402
from ember.wire.jetstream import Stores, connect, ensure_buckets  # noqa: E402
from ember_platform.calls.durable import Calls  # noqa: E402
from ember_platform.control.schedules import ScheduleLoop  # noqa: E402

try:  # a commit before atomic batches (bench/compare_commits.py) runs the same script
    from ember.wire.atomic import allow_atomic
    from ember.wire.jetstream import kv_stream
except ImportError:
    allow_atomic = None  # type: ignore[assignment]

APPS, PER_APP, PERIOD_S = 10, 100, 2.0
GOALS = "goals: lag p99 <= 200 ms, loop pass <= 5 ms"


def started_at(now: float) -> dict[str, float]:  # a replica sets it with "running"; older records lack it
    return {"started_at": now} if "started_at" in CallRecord.__struct_fields__ else {}


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process, or of process ``pid``."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class TimedCalls(Calls):
    """The platform's calls, noting when each tick's call was queued (``submit_many`` where the loop has it)."""

    queued: dict[str, float] = {}

    async def submit(self, app, function, body, **kwargs):  # type: ignore[no-untyped-def, override]
        reply = await super().submit(app, function, body, **kwargs)
        if kwargs.get("msg_id"):
            self.queued[kwargs["msg_id"]] = time.time()
        return reply

    async def submit_many(self, ticks):  # type: ignore[no-untyped-def, override]
        replies = await super().submit_many(ticks)
        now = time.time()
        self.queued.update({tick.msg_id: now for tick, reply in zip(ticks, replies, strict=True)
                            if not isinstance(reply, BaseException)})
        return replies


def deployments(work: Path, overlap: str) -> dict[str, Deployment]:
    """The manifests of ``APPS`` modules of ``PER_APP`` scheduled functions, as ``ember push`` reads them."""
    out = {}
    for a in range(APPS):
        app = f"sched-{a}"
        source = [f"import ember\napp = ember.App({app!r})\n"]
        source += [f"@app.function(schedule=ember.Period(seconds={PERIOD_S}, overlap={overlap!r}))\n"
                   f"def f{i}() -> None: ...\n" for i in range(PER_APP)]
        path = work / f"sched_{a}.py"
        path.write_text("\n".join(source))
        out[app] = Deployment(app=app, version=1, bundle_sha256="0" * 64, created_at=time.time(),
                              manifest=inspect_app(path))
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def tick_of(msg_id: str) -> float:
    return int(msg_id.rsplit(".", 1)[1]) / 1000


# -- the stand-in replicas (a process of their own) ---------------------------------------------------------------

async def replicas(url: str, out: Path) -> None:
    """Pull every queued call, mark it running, store its final record, ack; write each tick's start at the end. Each
    call is handled in a task of its own while the next ones are pulled."""
    nc = await connect(url, "bench-replicas")
    js = nc.jetstream()
    stores = await ensure_buckets(js, create=False)
    store = CallStore(js, stores.calls, stores.results)
    sub = await js.pull_subscribe(subjects.CALLS_ALL, durable="bench-replicas", stream=subjects.CALLS_STREAM)
    started: dict[str, float] = {}
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def run(msg) -> None:  # type: ignore[no-untyped-def]
        now = time.time()
        call_id, msg_id = msg.headers[CALL_ID_HEADER], msg.headers["Nats-Msg-Id"]
        app, function = msg_id.split(".")[:2]
        record = CallRecord(call_id=call_id, app=app, function=function, status="running", created_at=now,
                            updated_at=now, replica="bench", **started_at(now))
        started[msg_id] = now
        await store.set_status(record)
        await store.finish(final(record, "succeeded"))
        await msg.ack()

    running: set[asyncio.Task[None]] = set()
    while not stop.is_set():  # pulls on while what it pulled is stored: 1,000 replicas would not wait on each other
        try:
            msgs = await sub.fetch(512, timeout=0.25)
        except TimeoutError:
            continue
        for m in msgs:
            task = asyncio.create_task(run(m))
            running.add(task)
            task.add_done_callback(running.discard)
    await asyncio.gather(*running)
    out.write_text(json.dumps(started))
    await nc.close()


# -- the control plane's side -------------------------------------------------------------------------------------

async def run(url: str, work: Path, overlap: str, rounds: int, server: int) -> list[list[str]]:
    nc = await connect(url, "bench-schedules")
    stores: Stores = await ensure_buckets(nc.jetstream())
    if allow_atomic is not None:  # as the control plane does at its start
        for stream in (kv_stream(subjects.CALLS_BUCKET), subjects.CALLS_STREAM):
            await allow_atomic(nc.jetstream(), stream)
    calls = TimedCalls(nc, stores, 30.0)
    started_file = work / "started.json"
    stand_in = subprocess.Popen([sys.executable, __file__, "--replicas", url, str(started_file)])
    loop = ScheduleLoop(nc.jetstream(), calls, SimpleNamespace(items=deployments(work, overlap), generation=1),  # type: ignore[arg-type]
                        active=lambda: True)
    await loop.start()
    first = math.floor(time.time() / PERIOD_S) * PERIOD_S + PERIOD_S  # functions seen now run from this tick on
    await asyncio.sleep(max(0.0, first - 0.5 - time.time()))
    pids = {"control plane (the loop)": None, "stand-in replicas": stand_in.pid, "nats-server": server}
    cpu = {name: cpu_s(pid) for name, pid in pids.items()}
    await asyncio.sleep(first + (rounds - 1) * PERIOD_S + 1.0 - time.time())  # ``rounds`` ticks, then 1 s
    cpu = {name: (cpu_s(pid) - cpu[name]) / rounds for name, pid in pids.items()}
    await loop.stop()
    await asyncio.sleep(1.0)  # the last ticks' calls started
    stop_process(stand_in)  # type: ignore[arg-type]
    await nc.close()
    started = json.loads(started_file.read_text()) if started_file.exists() else {}
    queued_lags = [1000 * (at - tick_of(m)) for m, at in calls.queued.items()]
    start_lags = [1000 * (at - tick_of(m)) for m, at in started.items()]
    if not queued_lags:  # the loop's passes failed (logged above): no figure to print
        raise SystemExit("no tick was queued: the schedule loop's log above says why")
    idle, busy = passes(loop)
    return [["figure", "value"],
            ["scheduled functions", f"{APPS * PER_APP}"],
            ["overlap", overlap],
            ["ticks due", f"{APPS * PER_APP * rounds}"],
            ["ticks queued", f"{len(queued_lags)}"],
            *([f"ticks {status}", f"{count:.0f}"] for status, count in outcomes(loop) if status != "fired"),
            ["lag tick -> queued p50 (ms)", f"{pct(queued_lags, 0.5):.1f}"],
            ["lag tick -> queued p99 (ms)", f"{pct(queued_lags, 0.99):.1f}"],
            ["lag tick -> start p50 (ms)", f"{pct(start_lags, 0.5):.1f}"],
            ["lag tick -> start p99 (ms)", f"{pct(start_lags, 0.99):.1f}"],
            ["loop pass, nothing due p50 (ms)", f"{pct(idle, 0.5):.3f}"],
            ["loop pass, nothing due p99 (ms)", f"{pct(idle, 0.99):.3f}"],
            ["loop pass at a tick (1,000 due) mean (ms)", f"{statistics.mean(busy) if busy else math.nan:.1f}"],
            *([f"CPU per tick, {name} (ms)", f"{1000 * seconds:.0f}"] for name, seconds in cpu.items())]


def outcomes(loop: ScheduleLoop) -> list[tuple[str, float]]:
    """How many ticks the loop fired, skipped, missed, ... (``ember_schedule_runs_total``), all apps together."""
    found: dict[str, float] = {}
    for metric in loop.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "ember_schedule_runs_total":
                found[sample.labels["status"]] = found.get(sample.labels["status"], 0) + sample.value
    return sorted(found.items())


def passes(loop: ScheduleLoop) -> tuple[list[float], list[float]]:
    """The passes with nothing due and those at a tick (ms). Where the loop does not say what each pass handled
    (an older loop), a pass 5 times the median or more counts as one at a tick."""
    counted = getattr(loop, "passes", None)
    if counted is not None:
        return [1000 * s for s, n in counted if n == 0], [1000 * s for s, n in counted if n >= APPS * PER_APP // 2]
    ms = [1000 * s for s in loop.pass_s]
    median = statistics.median(ms)
    return [p for p in ms if p < median * 5], [p for p in ms if p >= median * 5]


def start_nats(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd",
                             str(work / "nats")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"nats://127.0.0.1:{port}"
        time.sleep(0.05)
    raise SystemExit("nats-server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overlap", default="skip", choices=("skip", "queue", "allow"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replicas", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replicas:
        run_loop(replicas(args.replicas[0], Path(args.replicas[1])))
        return
    with tempfile.TemporaryDirectory() as work:
        proc, url = start_nats(Path(work))
        try:
            rows = run_loop(run(url, Path(work), args.overlap, args.rounds, proc.pid))
        finally:
            stop_process(proc)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{os.uname().nodename} python {sys.version.split()[0]} {when}; {GOALS}")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
