"""Durable queues: the digits classifier called through spawn, batched and unbatched, beside synchronous HTTP.

What is measured
    The digits classifier (examples/digits: ``model.py``, ``weights.pt``, ``schema.py``) deployed twice, with
    the app files that bench/batching.py generates:

    * ``batched``     ``@ember.method(batch=ember.Batch(max_size=32, window_ms=5))``;
    * ``unbatched``   the same app without ``batch=`` (the replica runs one call at a time).

    For each variant, in one run:

    * ``HTTP c64``    synchronous calls (``POST /v1/<app>/Classifier.predict``), 64 closed-loop connections,
                      with http_latency.py's load generator (warm-up, then a window);
    * ``spawn N``     N calls submitted through ``POST /v1/<app>/Classifier.predict/spawn`` (202 + call id) by
                      a bounded submitter (``--submit-concurrency`` keep-alive connections, each sending the
                      next submit as soon as the previous 202 arrived), for N = 1,000 and 10,000 (``--quick``:
                      300 and 2,000); then every call's record is read with ``GET /v1/calls/<id>?wait=S``
                      (``--poll-concurrency`` connections, in submit order) until it is final.

    Reported per spawn cell: the submit rate (N / first submit to last 202), calls/s end to end (N / first
    submit to the last stored result, i.e. the largest ``updated_at`` of the final records), the p50/p99
    latency from submit to stored result (``updated_at - created_at`` of each final record: both are epoch
    seconds, ``created_at`` written by the gateway when it accepted the call, ``updated_at`` by the replica
    when it stored the result), the mean batch size (``ember_batch_size`` sum/count of ``GET /metrics``, the
    difference over the cell), and the CPU each of our processes spent per call over the cell (gateway,
    nats-server, the replica; from ``/proc/<pid>/stat``). The polling does not enter the latencies or the
    end-to-end rate (they come from the records' own timestamps), but its CPU is in the gateway's and
    nats-server's share. The last column is the CPU the rest of the machine (work that is not this benchmark)
    took over the cell, in cores, from ``/proc/stat``.

    Before the measured cells of a variant, a small spawn warm-up (discarded) runs the path once.

    ``--max-unbatched N`` caps the largest unbatched cell (the table says so when it did).

How
    One run starts an ``EmbeddedPlatform`` (nats-server, control plane, node agent) in a temporary directory,
    writes and deploys both apps, measures, prints one Markdown table, and stops everything it started,
    on exit, on error, on Ctrl-C and on SIGTERM. It makes no pass/fail judgement.

Usage
    python bench/queues.py [--quick] [--max-unbatched N] [--submit-concurrency K] [--poll-concurrency K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import http_latency  # noqa: E402  (bench/ is not a package)
from batching import (  # noqa: E402
    BATCHED_APP,
    DEFAULT_HIDDEN,
    DIGITS_DIR,
    MAX_BATCH,
    MODELS_PY,
    STATS_SETTLE_S,
    UNBATCHED_APP,
    WINDOW_MS,
    CpuWindow,
    Processes,
    app_name,
    deploy_all,
    sample_bodies,
)
from http_latency import Connection, Target, auth_headers, markdown_table, run_interruptible, say  # noqa: E402

MODEL = "digits"
VARIANTS = ("batched", "unbatched")
FUNCTION = "Classifier.predict"
HTTP_CONCURRENCY = 64
FINAL = {"succeeded", "failed", "cancelled", "expired"}
REQUEST_TIMEOUT_S = 60.0
POLL_WAIT_S = 20  # the ?wait= of each long-poll
CELL_TIMEOUT_S = 900.0  # a spawn cell that has not finished by then is reported as such


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]
    warmup_calls: int
    http: http_latency.Plan


FULL = Plan(sizes=(1_000, 10_000), warmup_calls=100, http=http_latency.FULL)
QUICK = Plan(sizes=(300, 2_000), warmup_calls=50, http=http_latency.QUICK)


# -- a small HTTP/1.1 client that also reads bodies ----------------------------------------------------


class ApiConnection(Connection):
    """http_latency's keep-alive connection, with any method and path, returning the body too."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, url: str,
                 token: str | None = None) -> None:
        super().__init__(reader, writer, url, token)
        self._host = urlsplit(url).netloc

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        self._writer.write(f"{method} {path} HTTP/1.1\r\nHost: {self._host}\r\n{self._auth}"
                           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        head = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        length = None
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if length is None:
            raise RuntimeError(f"expected a Content-Length answer, got {head}")
        return status, await self._reader.readexactly(length)


# -- one spawn cell --------------------------------------------------------------------------------


@dataclass
class SpawnCell:
    variant: str
    requested: int  # what the plan asked for
    calls: int  # what was submitted (lower when capped)
    submit_first: float = 0.0  # epoch s, just before the first submit was written
    submit_last: float = 0.0  # epoch s, when the last 202 arrived
    submit_errors: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    unfinished: int = 0  # calls not final when the cell gave up
    read_done: float = 0.0  # epoch s, when the last record was read
    batch: dict[str, float] = field(default_factory=dict)  # metrics deltas
    cpu: CpuWindow | None = None

    @property
    def submit_rate(self) -> float:
        span = self.submit_last - self.submit_first
        return self.calls / span if span > 0 else math.nan

    @property
    def last_stored(self) -> float:
        return max((r["updated_at"] for r in self.records), default=math.nan)

    @property
    def e2e_s(self) -> float:
        return self.last_stored - self.submit_first

    @property
    def e2e_rate(self) -> float:
        return len(self.records) / self.e2e_s if self.e2e_s > 0 else math.nan

    @property
    def latencies_ms(self) -> list[float]:
        return sorted(1000 * (r["updated_at"] - r["created_at"]) for r in self.records)

    @property
    def not_succeeded(self) -> int:
        return sum(r["status"] != "succeeded" for r in self.records) + self.unfinished + len(self.submit_errors)


def nearest_rank(ordered: list[float], q: float) -> float:
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else math.nan


async def submit_all(url: str, path: str, bodies: list[bytes], n: int, concurrency: int,
                     cell: SpawnCell | None) -> list[str]:
    """Submit ``n`` calls with ``concurrency`` back-to-back connections; return the call ids in submit order."""
    conns = [await ApiConnection.open(url) for _ in range(min(concurrency, n))]
    ids: list[str | None] = [None] * n
    errors: list[str] = []
    next_i = 0

    async def worker(conn: ApiConnection) -> None:
        nonlocal next_i
        while next_i < n:
            i = next_i
            next_i += 1
            status, body = await asyncio.wait_for(conn.request("POST", path, bodies[i % len(bodies)]),
                                                  REQUEST_TIMEOUT_S)
            if status != 202:
                errors.append(f"{status}: {body[:200].decode(errors='replace')}")
                continue
            ids[i] = json.loads(body)["call_id"]

    try:
        first = time.time()
        await asyncio.gather(*(worker(c) for c in conns))
        last = time.time()
    finally:
        for conn in conns:
            await conn.close()
    if cell is not None:
        cell.submit_first, cell.submit_last, cell.submit_errors = first, last, errors
    elif errors:
        raise RuntimeError(f"{len(errors)} submits failed, first: {errors[0]}")
    return [i for i in ids if i is not None]


async def read_all(url: str, ids: list[str], concurrency: int, give_up_at: float) -> tuple[list[dict[str, Any]], int]:
    """Long-poll every call (in submit order) until final; return the final records and how many never were."""
    conns = [await ApiConnection.open(url) for _ in range(min(concurrency, len(ids)))]
    records: list[dict[str, Any]] = []
    unfinished = 0
    next_i = 0

    async def worker(conn: ApiConnection) -> None:
        nonlocal next_i, unfinished
        while next_i < len(ids):
            call_id = ids[next_i]
            next_i += 1
            while True:
                left = give_up_at - time.time()
                if left <= 0:
                    unfinished += 1
                    break
                wait = max(0, min(POLL_WAIT_S, int(left)))
                status, body = await asyncio.wait_for(conn.request("GET", f"/v1/calls/{call_id}?wait={wait}"),
                                                      wait + REQUEST_TIMEOUT_S)
                if status != 200:
                    raise RuntimeError(f"GET /v1/calls/{call_id}: {status} {body[:200]!r}")
                record = json.loads(body)
                if record["status"] in FINAL:
                    records.append(record)
                    break

    try:
        await asyncio.gather(*(worker(c) for c in conns))
    finally:
        for conn in conns:
            await conn.close()
    return records, unfinished


# -- metrics and pids ------------------------------------------------------------------------------


def read_metrics(url: str, app: str) -> dict[str, float]:
    """Sums over the app's replicas of the ``ember_batch_size`` and ``ember_calls_total`` series."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10, headers=auth_headers()).text
    wanted = ("ember_batch_size_sum", "ember_batch_size_count", "ember_calls_total",
              "ember_queue_wait_seconds_sum", "ember_queue_wait_seconds_count")
    out = dict.fromkeys(wanted, 0.0)
    for line in text.splitlines():
        name, brace, rest = line.partition("{")
        if name in out and brace and f'app="{app}"' in rest and f'function="{FUNCTION}"' in rest:
            out[name] += float(rest.rpartition(" ")[2])
    return out


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    d = {k: after[k] - before[k] for k in before}
    batches, waits = d["ember_batch_size_count"], d["ember_queue_wait_seconds_count"]
    return {
        "calls": d["ember_calls_total"],
        "batches": batches,
        "mean_batch": d["ember_batch_size_sum"] / batches if batches else math.nan,
        "queue_wait_ms": 1000 * d["ember_queue_wait_seconds_sum"] / waits if waits else math.nan,
    }


def replica_pids(url: str, app: str) -> list[int]:
    import httpx

    view = httpx.get(f"{url}/v1/apps/{app}", timeout=10, headers=auth_headers()).json()
    return [r["pid"] for s in view["services"] for r in s["replicas"]
            if r["state"] == "ready" and r["version"] == view["version"]]


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class HttpRow:
    variant: str
    cell: http_latency.Cell
    cpu: CpuWindow


async def measure_variant(variant: str, url: str, plan: Plan, args: argparse.Namespace, procs: Processes,
                          bodies: list[bytes]) -> tuple[HttpRow, list[SpawnCell]]:
    app = app_name(MODEL, variant)
    say(f"{app}: replica pid(s) {procs.replicas[app]}")

    say(f"{app}: synchronous HTTP at concurrency {HTTP_CONCURRENCY}")
    target = Target(f"{app} HTTP", f"{url}/v1/{app}/{FUNCTION}", bodies, is_ember=True)
    cpu = CpuWindow(procs)
    cpu.start()
    http_cell = await http_latency.measure(target, HTTP_CONCURRENCY, plan.http)
    cpu.stop()
    http_row = HttpRow(variant, http_cell, cpu)

    spawn_path = f"/v1/{app}/{FUNCTION}/spawn"
    say(f"{app}: spawn warm-up, {plan.warmup_calls} calls (discarded)")
    ids = await submit_all(url, spawn_path, bodies, plan.warmup_calls, args.submit_concurrency, None)
    _, unfinished = await read_all(url, ids, args.poll_concurrency, time.time() + 120)
    if unfinished:
        raise RuntimeError(f"{app}: {unfinished} warm-up calls did not finish within 120 s")

    cells = []
    for size in plan.sizes:
        n = size
        if variant == "unbatched" and args.max_unbatched is not None:
            n = min(n, args.max_unbatched)
        await asyncio.sleep(STATS_SETTLE_S)  # the replica's counters include everything before this cell
        before = await asyncio.to_thread(read_metrics, url, app)
        cell = SpawnCell(variant, size, n)
        say(f"{app}: spawn {n:,} calls" + (f" (capped from {size:,})" if n != size else ""))
        cell.cpu = CpuWindow(procs)
        cell.cpu.start()
        ids = await submit_all(url, spawn_path, bodies, n, args.submit_concurrency, cell)
        say(f"{app}: {len(ids):,} submitted in {cell.submit_last - cell.submit_first:.1f} s "
            f"({cell.submit_rate:,.0f}/s, {len(cell.submit_errors)} refused); reading the results")
        cell.records, cell.unfinished = await read_all(url, ids, args.poll_concurrency,
                                                       cell.submit_first + CELL_TIMEOUT_S)
        cell.read_done = time.time()
        cell.cpu.stop()
        say(f"{app}: {len(cell.records):,} final records; last stored {cell.e2e_s:.1f} s after the first submit, "
            f"last read {cell.read_done - cell.submit_first:.1f} s after it")
        await asyncio.sleep(STATS_SETTLE_S)
        cell.batch = metrics_delta(before, await asyncio.to_thread(read_metrics, url, app))
        cells.append(cell)
    return http_row, cells


def cpu_per_call(cpu: CpuWindow | None, pids: list[int], n: int) -> str:
    if cpu is None or not n:
        return "-"
    return f"{1000 * sum(cpu.spent.get(p, 0.0) for p in pids) / n:.2f}"


def not_ours(cpu: CpuWindow | None, procs: Processes) -> str:
    """CPU the rest of the machine (not this benchmark) took over the cell, in cores."""
    if cpu is None or not cpu.wall_s:
        return "-"
    ours = sum(cpu.spent.get(p, 0.0) for p in procs.all()) + cpu.gen_s
    return f"{max(0.0, cpu.busy_s - ours) / cpu.wall_s:.2f}"


def render(http_rows: list[HttpRow], cells: list[SpawnCell], procs: Processes) -> str:
    rows = [["variant", "path", "calls", "not ok", "submit/s", "calls/s end to end", "p50 ms", "p99 ms",
             "mean batch", "wall s", "gateway CPU ms/call", "nats CPU ms/call", "replica CPU ms/call",
             "other load, cores"]]
    for variant in VARIANTS:
        app = app_name(MODEL, variant)
        reps = procs.replicas.get(app, [])
        for h in (h for h in http_rows if h.variant == variant):
            c = h.cell
            rows.append([variant, f"HTTP sync, {HTTP_CONCURRENCY} conns", f"{c.requests:,}", str(c.errors), "-",
                         f"{c.rps:,.0f}", f"{c.percentile(50):.1f}", f"{c.percentile(99):.1f}",
                         f"{c.mean_batch:.1f}", f"{c.elapsed_s:.1f}",
                         cpu_per_call(h.cpu, [procs.gateway], c.requests),
                         cpu_per_call(h.cpu, [procs.nats], c.requests),
                         cpu_per_call(h.cpu, reps, c.requests), not_ours(h.cpu, procs)])
        for s in (s for s in cells if s.variant == variant):
            lat = s.latencies_ms
            label = f"spawn {s.calls:,}" + (f" (capped from {s.requested:,})" if s.calls != s.requested else "")
            rows.append([variant, label, f"{len(s.records):,}", str(s.not_succeeded), f"{s.submit_rate:,.0f}",
                         f"{s.e2e_rate:,.0f}", f"{nearest_rank(lat, 50):,.0f}", f"{nearest_rank(lat, 99):,.0f}",
                         f"{s.batch.get('mean_batch', math.nan):.1f}", f"{s.e2e_s:.1f}",
                         cpu_per_call(s.cpu, [procs.gateway], s.calls), cpu_per_call(s.cpu, [procs.nats], s.calls),
                         cpu_per_call(s.cpu, reps, s.calls), not_ours(s.cpu, procs)])
    return markdown_table(rows)


def write_apps(folder: Path) -> list[Path]:
    """The digits model and the two app files of bench/batching.py, digits only."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("model.py", "weights.pt", "schema.py"):
        shutil.copyfile(DIGITS_DIR / name, folder / name)
    (folder / "bench_models.py").write_text(MODELS_PY.format(hidden=DEFAULT_HIDDEN, max_batch=MAX_BATCH))
    files = []
    for variant, template in (("batched", BATCHED_APP), ("unbatched", UNBATCHED_APP)):
        path = folder / f"{MODEL}_{variant}.py"
        path.write_text(template.format(model=MODEL, app=app_name(MODEL, variant), max_batch=MAX_BATCH,
                                        window_ms=WINDOW_MS, gpu=""))  # on the CPU, as measured here
        files.append(path)
    return files


async def measure_all(url: str, plan: Plan, args: argparse.Namespace,
                      procs: Processes) -> tuple[list[HttpRow], list[SpawnCell]]:
    bodies = sample_bodies()
    for variant in VARIANTS:  # every replica's pid up front, so that none counts as "other load"
        app = app_name(MODEL, variant)
        procs.replicas[app] = await asyncio.to_thread(replica_pids, url, app)
    http_rows, cells = [], []
    for variant in VARIANTS:
        h, c = await measure_variant(variant, url, plan, args, procs, bodies)
        http_rows.append(h)
        cells.extend(c)
    return http_rows, cells


def run(plan: Plan, args: argparse.Namespace) -> None:
    from ember.dev.embedded import EmbeddedPlatform

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ember-bench-queues-"))
    platform = EmbeddedPlatform(work / "state", http_port=0)
    keep_logs = False
    try:
        files = write_apps(work / "apps")
        say(f"starting the platform in {platform.state_dir}")
        platform.start()
        os.environ["EMBER_TOKEN"] = platform.token  # for the SDK's transport and the load generator
        deploy_all(platform.url, files)
        procs = Processes(gateway=platform._procs["platform"].pid, nats=platform._procs["nats"].pid,
                          agent=platform._procs["agent"].pid)
        http_rows, cells = asyncio.run(measure_all(platform.url, plan, args, procs))
        print(f"## Queues: digits through spawn and over HTTP ({os.cpu_count()} CPUs; sync HTTP: "
              f"{plan.http.warmup_s:g} s warm-up + {plan.http.measure_s:g} s window; spawn: submit concurrency "
              f"{args.submit_concurrency}, poll concurrency {args.poll_concurrency})\n")
        print(render(http_rows, cells, procs), flush=True)
        print("\nInside the replica over each spawn cell (GET /metrics):")
        for s in cells:
            b = s.batch
            print(f"- {s.variant} spawn {s.calls:,}: {b.get('calls', 0):,.0f} calls in {b.get('batches', 0):,.0f} "
                  f"batches, mean wait in the replica's batcher {b.get('queue_wait_ms', math.nan):.2f} ms")
        for s in cells:
            if s.submit_errors or s.unfinished or s.not_succeeded:
                statuses: dict[str, int] = {}
                for r in s.records:
                    statuses[r["status"]] = statuses.get(r["status"], 0) + 1
                print(f"\n{s.variant} spawn {s.calls}: {len(s.submit_errors)} submits refused "
                      f"(first: {s.submit_errors[:1]}), {s.unfinished} never final, statuses {statuses}")
        say(f"done in {time.monotonic() - started:.0f} s")
    except BaseException:
        keep_logs = True
        raise
    finally:
        say("stopping")
        platform.stop()
        if keep_logs:
            say(f"logs kept in {platform.log_dir}")
            shutil.rmtree(work / "apps", ignore_errors=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 and 2,000 calls and shorter HTTP windows")
    parser.add_argument("--max-unbatched", type=int, metavar="N",
                        help="submit at most N calls in an unbatched spawn cell (reported as capped)")
    parser.add_argument("--submit-concurrency", type=int, default=32, metavar="K",
                        help="connections submitting back to back (default 32)")
    parser.add_argument("--poll-concurrency", type=int, default=8, metavar="K",
                        help="connections long-polling the results (default 8)")
    args = parser.parse_args()
    run_interruptible(lambda: run(QUICK if args.quick else FULL, args))


if __name__ == "__main__":
    main()
