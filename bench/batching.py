"""Micro-batching over HTTP: Ember batched and unbatched next to a bare endpoint that runs the model inline.

What is measured
    Two models, each served three ways, at concurrency 1, 8 and 64:

    * ``digits``   the digits classifier of examples/digits (64 -> 64 -> 10 MLP, weights.pt);
    * ``heavy``    a deterministic MLP 64 -> H -> H -> 10 (``--hidden``, default 3072) with seeded random
                   weights, whose per-sample cost falls several-fold from batch 1 to batch 32;

    served as

    * ``batched``     an Ember app, ``@ember.method(batch=ember.Batch(max_size=32, window_ms=5))``;
    * ``unbatched``   the same Ember app without ``batch=`` (the replica runs one call at a time);
    * ``bare inline`` a Starlette app under uvicorn (the gateway's settings) in a child process whose
                      handler decodes the body with msgspec and runs the model inline, one call at a time.

    All four Ember apps and both bare endpoints run the same generated code (``bench_models.py``, written
    into a temporary app folder next to copies of examples/digits/{model.py,weights.pt,schema.py}), with
    ``torch.set_num_threads(1)``. Before any server starts, a child process measures both models
    in-process at batch 1 and batch 32 (the bare forward pass and the whole per-batch code: stacking,
    forward, softmax, building the outputs), in microseconds per sample.

How
    The load generator is this process and reuses http_latency.py's: closed-loop workers, one keep-alive
    HTTP/1.1 connection each, a discarded warm-up and then a window bounded by time and by a request cap.
    Cells run model by model and, within a model, concurrency by concurrency, the three ways one after
    the other, so that the cells compared with each other are measured close together in time.

    Around every measured window the script reads the CPU time of its own process (``time.process_time``)
    and of every process it started (``/proc/<pid>/stat``): the control plane (gateway), nats-server, the
    node agent, every replica (pids from ``GET /v1/apps/<app>``) and the bare endpoints, plus the whole
    machine's busy and steal time (``/proc/stat``), so that the table shows where the two cores went and
    how much of them other work on the machine took. From the replicas' own batcher counters (their
    heartbeats in ``GET /v1/apps/<app>``, read before the warm-up and again once a heartbeat after the
    window has arrived) it also reports the mean time a call waited in the replica's queue and the mean run
    time of a batch, over the warm-up and the window.

    With ``--py-spy DIR`` (py-spy installed), the gateway and the replica of every Ember cell at concurrency
    1 and 64 are sampled during the measured window (raw collapsed stacks written to DIR) and the hottest
    functions are printed. py-spy itself takes CPU on the same cores: use such a run to see where the time
    goes, not for the numbers.

    The script prints tables and makes no pass/fail judgement (it prints the issue's targets next to what
    it measured). Everything it starts is stopped on exit, on error and on Ctrl-C / SIGTERM.

    With ``--device cuda`` the models run on the GPU, in the replicas (each of the four apps asks for
    ``gpu="8GB"``: the node packs them on one GPU by memory) and in both bare endpoints alike
    (bench/gpu/check.sh runs it so on a lent GPU machine).

Usage
    python bench/batching.py [--quick] [--hidden N] [--py-spy DIR] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from http_latency import (  # noqa: E402
    Cell,
    Connection,
    Target,
    auth_headers,
    markdown_table,
    run_interruptible,
    run_window,
    say,
    serve_routes,
    stop_process,
    wait_until_listening,
)

from ember import _loop as ember_loop  # noqa: E402

ROOT = BENCH.parent
DIGITS_DIR = ROOT / "examples" / "digits"
CONCURRENCIES = (1, 8, 64)
MODELS = ("digits", "heavy")
MODES = ("bare inline", "batched", "unbatched")
# 3072: on a 2-core EPYC VM the per-sample cost falls ~5.5x from batch 1 to 32, and a call at batch 1
# (~3 ms) costs more than the gateway's ~2 ms of CPU per request, so that unbatched, the replica is the
# bottleneck. With 2048 (~1.5 ms) the unbatched replica is barely slower than the gateway.
DEFAULT_HIDDEN = 3072
MAX_BATCH = 32
WINDOW_MS = 5
GPU_SHARE = "8GB"  # --device cuda: what each of the four apps asks of the one GPU they share
TICK_S = 1 / os.sysconf("SC_CLK_TCK")

# The targets (printed beside the measurements; nothing asserts them).
TARGET_VS_BARE = 1.4  # digits batched / bare inline req/s at concurrency 64
TARGET_VS_UNBATCHED = 2.0  # heavy batched / heavy unbatched req/s at concurrency 64
TARGET_P50_DELTA_MS = 0.7  # digits batched p50 - bare inline p50 at concurrency 1
TARGET_FALL = 4.0  # heavy: per-sample cost at batch 1 / at batch 32


@dataclass(frozen=True)
class Plan:
    warmup_s: float
    measure_s: float
    max_requests: int


FULL = Plan(warmup_s=1.0, measure_s=4.0, max_requests=100_000)
QUICK = Plan(warmup_s=0.3, measure_s=1.0, max_requests=10_000)


def app_name(model: str, mode: str) -> str:
    return f"{model}-{mode}"


# -- the generated app folder ----------------------------------------------------------------------

MODELS_PY = '''\
"""Generated by bench/batching.py: the two models of the batching benchmark, as one class.

Every Ember app of the benchmark and both bare endpoints run ``Runner.classify``; torch is imported in
``Runner()``, not when this module is imported.
"""

from pathlib import Path

from schema import Image, Prediction

from ember.backends import torch as et

HERE = Path(__file__).resolve().parent
HIDDEN = {hidden}
SEED = 0


def build_heavy():
    """64 -> HIDDEN -> HIDDEN -> 10, the same weights in every process (seeded, drawn at load)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return torch.nn.Sequential(torch.nn.Linear(64, HIDDEN), torch.nn.ReLU(),
                                   torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                                   torch.nn.Linear(HIDDEN, 10))


class Runner:
    def __init__(self, kind: str, warm_up: bool = True, device: str | None = None) -> None:
        """``device``: None in a replica (the one its node gave it), the benchmark's own elsewhere."""
        import torch

        torch.set_num_threads(1)
        self.device = device
        if kind == "digits":
            from model import DigitsNet

            self.net = et.load_module(DigitsNet, HERE / "weights.pt", device=device)
        elif kind == "heavy":
            self.net = et.load_module(build_heavy, device=device)
        else:
            raise ValueError(kind)
        if warm_up:
            et.warm_up(self.classify, Image(pixels=[0.0] * 64), sizes=(1, {max_batch}))

    def classify(self, images: list[Image]) -> list[Prediction]:
        with et.inference():
            x, n = et.stack([image.pixels for image in images], device=self.device, dtype="float32")
            confidence, label = self.net(x).softmax(dim=1).max(dim=1)
        return [Prediction(label=int(lbl), confidence=round(float(c), 4))
                for lbl, c in zip(et.unstack(label, n, tolist=True), et.unstack(confidence, n, tolist=True),
                                  strict=True)]
'''

BATCHED_APP = '''\
"""Generated by bench/batching.py: {model}, batched."""

from bench_models import Runner
from schema import Image, Prediction

import ember

app = ember.App("{app}")


@app.model(min_replicas=1, timeout_s=30{gpu})
class Classifier:
    @ember.setup
    def load(self) -> None:
        self.runner = Runner("{model}")

    @ember.method(batch=ember.Batch(max_size={max_batch}, window_ms={window_ms}))
    def predict(self, images: list[Image]) -> list[Prediction]:
        return self.runner.classify(images)
'''

UNBATCHED_APP = '''\
"""Generated by bench/batching.py: {model}, one call at a time (no batch=)."""

from bench_models import Runner
from schema import Image, Prediction

import ember

app = ember.App("{app}")


@app.model(min_replicas=1, timeout_s=30{gpu})
class Classifier:
    @ember.setup
    def load(self) -> None:
        self.runner = Runner("{model}")

    @ember.method
    def predict(self, image: Image) -> Prediction:
        return self.runner.classify([image])[0]
'''


def write_apps(folder: Path, hidden: int, device: str = "cpu") -> list[Path]:
    """Write the app folder; return the four app files. On ``cuda`` each app asks for ``GPU_SHARE`` of a GPU, so
    that the four replicas share one GPU by memory (the node packs them)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("model.py", "weights.pt", "schema.py"):
        shutil.copyfile(DIGITS_DIR / name, folder / name)
    (folder / "bench_models.py").write_text(MODELS_PY.format(hidden=hidden, max_batch=MAX_BATCH))
    files = []
    for model in MODELS:
        for mode, template in (("batched", BATCHED_APP), ("unbatched", UNBATCHED_APP)):
            path = folder / f"{model}_{mode}.py"
            path.write_text(template.format(model=model, app=app_name(model, mode), max_batch=MAX_BATCH,
                                            window_ms=WINDOW_MS,
                                            gpu=f", gpu={GPU_SHARE!r}" if device == "cuda" else ""))
            files.append(path)
    return files


def sample_bodies() -> list[bytes]:
    samples = json.loads((DIGITS_DIR / "samples.json").read_text())
    return [json.dumps({"pixels": s["pixels"]}).encode() for s in samples]


# -- in-process cost (runs in a child process) ------------------------------------------------------


def measure_in_process(app_dir: Path, device: str) -> None:
    """Print, as JSON, each model's per-sample cost at batch 1 and batch 32 on ``device``: forward only and whole
    batch."""
    sys.path.insert(0, str(app_dir))
    import msgspec
    import torch
    from bench_models import Runner
    from schema import Image

    samples = json.loads((DIGITS_DIR / "samples.json").read_text())
    images = [msgspec.convert({"pixels": s["pixels"]}, Image) for s in samples]
    batch = [images[i % len(images)] for i in range(MAX_BATCH)]
    out: dict[str, Any] = {"torch": torch.__version__}
    for kind in MODELS:
        runner = Runner(kind, device=device)  # sets torch.set_num_threads(1), as the replicas and bare endpoints do
        out["threads"] = torch.get_num_threads()
        params = sum(p.numel() for p in runner.net.parameters())
        x = {n: torch.tensor([im.pixels for im in batch[:n]], dtype=torch.float32, device=device)
             for n in (1, MAX_BATCH)}

        def forward(n: int, runner: Any = runner, x: Any = x) -> None:
            with torch.inference_mode():
                runner.net(x[n])
            if device == "cuda":
                torch.cuda.synchronize()  # the kernels' time, not their launch's

        def whole(n: int, runner: Any = runner) -> None:
            runner.classify(batch[:n])

        row: dict[str, Any] = {"params": params}
        for label, fn in (("forward", forward), ("classify", whole)):
            for n in (1, MAX_BATCH):
                row[f"{label}_b{n}_us"] = per_call_s(lambda fn=fn, n=n: fn(n)) / n * 1e6
        out[kind] = row
    print(json.dumps(out), flush=True)


def per_call_s(fn: Any, rounds: int = 7, round_s: float = 0.15) -> float:
    """Median over ``rounds`` of the mean seconds per call, each round about ``round_s`` long."""
    for _ in range(3):
        fn()
    start = time.perf_counter()
    fn()
    reps = max(1, int(round_s / max(time.perf_counter() - start, 1e-7)))
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        means.append((time.perf_counter() - start) / reps)
    return statistics.median(means)


def run_in_process_child(app_dir: Path, device: str) -> dict[str, Any]:
    from ember._procs import die_with_parent

    proc = subprocess.run([sys.executable, __file__, "--measure-in-process", "--app-dir", str(app_dir),
                           "--device", device],
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=300, check=False,
                          preexec_fn=die_with_parent)
    if proc.returncode != 0:
        raise RuntimeError(f"the in-process measurement failed:\n{proc.stderr.decode(errors='replace')}")
    result: dict[str, Any] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return result


# -- the bare inline endpoints (run in child processes) ----------------------------------------------


def serve_inline(kind: str, app_dir: Path, device: str) -> None:
    """Serve ``POST /predict`` running ``kind`` inline, one call at a time; print the port once bound."""
    sys.path.insert(0, str(app_dir))
    import msgspec
    from bench_models import Runner
    from schema import Image
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    runner = Runner(kind, device=device)
    decode = msgspec.json.Decoder(Image).decode
    encode = msgspec.json.Encoder().encode

    async def predict(request: Request) -> Response:
        try:
            image = decode(await request.body())
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return Response(encode({"error": str(exc)}), status_code=422, media_type="application/json")
        return Response(encode(runner.classify([image])[0]), media_type="application/json")

    serve_routes([Route("/predict", predict, methods=["POST"])])


def start_inline_server(kind: str, app_dir: Path, device: str) -> tuple[subprocess.Popen[bytes], str]:
    from ember._procs import die_with_parent

    proc = subprocess.Popen([sys.executable, __file__, "--serve-inline", kind, "--app-dir", str(app_dir),
                             "--device", device],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True,
                            preexec_fn=die_with_parent)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        stop_process(proc)
        raise RuntimeError(f"the bare inline {kind} endpoint did not start")
    url = f"http://127.0.0.1:{int(line)}"
    wait_until_listening(url)
    return proc, url


# -- CPU accounting ------------------------------------------------------------------------------------


def proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (all its threads), or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def machine_cpu_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot, all CPUs together."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values
    return (user + nice + system + irq + softirq) * TICK_S, steal * TICK_S


@dataclass
class Processes:
    """The pids this script started, by role; replicas by app."""

    gateway: int = 0
    nats: int = 0
    agent: int = 0
    bare: dict[str, int] = field(default_factory=dict)  # model -> pid
    replicas: dict[str, list[int]] = field(default_factory=dict)  # app -> pids

    def all(self) -> list[int]:
        pids = [self.gateway, self.nats, self.agent, *self.bare.values()]
        return [p for p in pids if p] + [p for ps in self.replicas.values() for p in ps]


class CpuWindow:
    """CPU seconds each process (and the machine) spent between ``start()`` and ``stop()``."""

    def __init__(self, procs: Processes) -> None:
        self.procs = procs
        self.spent: dict[int, float] = {}
        self.gen_s = self.wall_s = self.busy_s = self.steal_s = 0.0

    def _snapshot(self) -> tuple[dict[int, float | None], float, float, tuple[float, float]]:
        return ({pid: proc_cpu_s(pid) for pid in self.procs.all()}, time.process_time(), time.perf_counter(),
                machine_cpu_s())

    def start(self) -> None:
        self._first = self._snapshot()

    def stop(self) -> None:
        (before, gen0, wall0, (busy0, steal0)), (after, gen1, wall1, (busy1, steal1)) = self._first, self._snapshot()
        self.spent = {pid: after[pid] - before[pid] for pid in before  # type: ignore[operator]
                      if before[pid] is not None and after.get(pid) is not None}
        self.gen_s, self.wall_s = gen1 - gen0, wall1 - wall0
        self.busy_s, self.steal_s = busy1 - busy0, steal1 - steal0

    def share(self, seconds: float) -> float:
        """CPU seconds as a share of one core over the window (1.0 = one core busy all the time)."""
        return seconds / self.wall_s if self.wall_s else math.nan

    def of(self, pids: list[int]) -> float:
        return self.share(sum(self.spent.get(p, 0.0) for p in pids))


# -- measuring -------------------------------------------------------------------------------------


@dataclass
class Row:
    model: str
    mode: str
    cell: Cell
    cpu: CpuWindow
    server_pids: list[int]  # the target's own server: the replica(s) or the bare endpoint
    profile: dict[str, Path] = field(default_factory=dict)
    # The replica's own batcher counters (from its heartbeats) before the warm-up and after the window.
    stats_before: dict[str, Any] | None = None
    stats_after: dict[str, Any] | None = None
    ended_at: float = 0.0

    @property
    def name(self) -> str:
        return self.cell.target.name

    @property
    def app(self) -> str:
        return app_name(self.model, self.mode)

    def replica_delta(self) -> dict[str, float] | None:
        """Calls, batches, mean queue wait and mean batch run time inside the replica over warm-up + window."""
        a, b = self.stats_before, self.stats_after
        if a is None or b is None:
            return None
        calls, batches = b["calls"] - a["calls"], b["batches"] - a["batches"]

        def mean_ms(hist: str) -> float:
            count = b[hist]["count"] - a[hist]["count"]
            return 1000 * (b[hist]["sum"] - a[hist]["sum"]) / count if count else math.nan

        return {
            "calls": calls, "batches": batches,
            "mean_batch": calls / batches if batches else math.nan,
            "queue_wait_ms": mean_ms("queue_wait_s"), "run_ms": mean_ms("run_s"),
            "expired": b["expired"] - a["expired"], "rejected": b["rejected"] - a["rejected"],
        }


# A replica reports its counters every 2 s (ember_runtime.replica.HEARTBEAT_S); read them this long after a
# window closed to be sure that they include the whole window.
STATS_SETTLE_S = 2.6


def refresh(url: str, procs: Processes) -> dict[str, dict[str, Any]]:
    """Update the replicas' pids; return each Ember app's batcher counters (summed over its ready replicas)."""
    import httpx

    stats: dict[str, dict[str, Any]] = {}
    for model in MODELS:
        for mode in ("batched", "unbatched"):
            app = app_name(model, mode)
            view = httpx.get(f"{url}/v1/apps/{app}", timeout=10, headers=auth_headers()).json()
            ready = [r for s in view["services"] for r in s["replicas"]
                     if r["state"] == "ready" and r["version"] == view["version"]]
            procs.replicas[app] = [r["pid"] for r in ready]
            functions = [f for r in ready for f in r.get("functions", [])]
            if functions:
                stats[app] = _sum_stats(functions)
    return stats


def _sum_stats(functions: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {k: sum(f[k] for f in functions) for k in ("calls", "batches", "expired", "rejected")}
    for hist in ("queue_wait_s", "run_s"):
        total[hist] = {k: sum(f[hist][k] for f in functions) for k in ("sum", "count")}
    return total


async def measure_cell(model: str, mode: str, target: Target, concurrency: int, plan: Plan, procs: Processes,
                       stats: dict[str, dict[str, Any]], profile_dir: Path | None) -> Row:
    app = app_name(model, mode)
    conns = [await Connection.open(target.url, target.token) for _ in range(concurrency)]
    try:
        await run_window(None, conns, target.bodies, plan.warmup_s, plan.max_requests)
        server = [procs.bare[model]] if mode == "bare inline" else procs.replicas.get(app, [])
        row = Row(model, mode, Cell(target, concurrency), CpuWindow(procs), server, stats_before=stats.get(app))
        spies = []
        if profile_dir is not None and target.is_ember and concurrency in (min(CONCURRENCIES), max(CONCURRENCIES)):
            for role, pid in (("gateway", procs.gateway), ("replica", server[0] if server else 0)):
                if pid:
                    path = profile_dir / f"{app}-c{concurrency}-{role}.txt"
                    spies.append(start_py_spy(pid, plan.measure_s, path))
                    row.profile[role] = path
            await asyncio.sleep(0.5)  # let py-spy attach before the window opens
        row.cpu.start()
        await run_window(row.cell, conns, target.bodies, plan.measure_s, plan.max_requests)
        row.cpu.stop()
        row.ended_at = time.monotonic()
        for spy in spies:
            await asyncio.to_thread(spy.wait, plan.measure_s + 30)
        return row
    finally:
        for conn in conns:
            await conn.close()


async def measure_all(targets: dict[tuple[str, str], Target], plan: Plan, procs: Processes, ember_url: str,
                      profile_dir: Path | None) -> list[Row]:
    rows: list[Row] = []
    waiting: list[Row] = []  # Ember rows whose replica counters after the window are not read yet

    async def settle(rows_to_settle: list[Row]) -> None:
        if rows_to_settle:
            await asyncio.sleep(max(0.0, max(r.ended_at for r in rows_to_settle) + STATS_SETTLE_S - time.monotonic()))

    async def read_stats() -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        stats = await asyncio.to_thread(refresh, ember_url, procs)
        for row in [r for r in waiting if r.ended_at + STATS_SETTLE_S <= now]:
            row.stats_after = stats.get(row.app)
            waiting.remove(row)
        return stats

    for model in MODELS:
        for concurrency in CONCURRENCIES:
            for mode in MODES:
                app = app_name(model, mode)
                await settle([r for r in waiting if r.app == app])  # its counters before new traffic
                stats = await read_stats()
                say(f"measuring {model} {mode} at concurrency {concurrency}")
                row = await measure_cell(model, mode, targets[model, mode], concurrency, plan, procs, stats,
                                         profile_dir)
                rows.append(row)
                if row.cell.target.is_ember:
                    waiting.append(row)
    await settle(waiting)
    await read_stats()
    return rows


# -- py-spy (optional) -----------------------------------------------------------------------------


def py_spy_binary() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def start_py_spy(pid: int, duration_s: float, path: Path) -> subprocess.Popen[bytes]:
    from ember._procs import die_with_parent

    binary = py_spy_binary()
    assert binary is not None
    cmd = [binary, "record", "--pid", str(pid), "--duration", str(math.ceil(duration_s)), "--rate", "200",
           "--format", "raw", "--nonblocking", "--output", str(path)]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=die_with_parent)


def summarize_profile(path: Path, top: int = 10) -> str:
    """A py-spy raw (collapsed) profile in short: shares of the samples by package (self time), the hottest
    functions (self time) and Ember's own functions (inclusive time)."""
    if not path.exists():
        return f"  (no profile at {path})"
    by_package: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    ember_inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = [f for f in (_frame(raw) for raw in stack.split(";")) if f is not None]
        if not frames or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        name, where = frames[-1]
        by_package[_package(where)] += count
        self_time[f"{name} ({where})"] += count
        for name, where in {f for f in frames if _package(f[1]) in EMBER_PACKAGES and f[0] not in ("<module>", "main")}:
            ember_inclusive[f"{name} ({where})"] += count
    if not total:
        return "  (no samples)"

    def pct(n: int) -> str:
        return f"{100 * n / total:5.1f}%"

    lines = [f"  {total} samples. Self time by package: "
             + ", ".join(f"{pkg} {100 * n / total:.0f}%" for pkg, n in by_package.most_common(8))]
    lines.append("  hottest functions (self time):")
    lines += [f"    {pct(n)}  {name}" for name, n in self_time.most_common(top)]
    lines.append("  Ember's functions (inclusive time):")
    lines += [f"    {pct(n)}  {name}" for name, n in ember_inclusive.most_common(top)]
    return "\n".join(lines)


EMBER_PACKAGES = ("ember", "ember_platform", "ember_runtime", "app")


def _frame(raw: str) -> tuple[str, str] | None:
    """``func (pkg/file.py:123)`` -> ``("func", "pkg/file.py")``; py-spy's process/thread headers -> None."""
    raw = raw.strip()
    if not raw or raw.startswith(("process ", "thread ")):
        return None
    name, _, where = raw.partition(" (")
    return name, where.rstrip(")").rsplit(":", 1)[0]


def _package(where: str) -> str:
    """The top-level package of a py-spy file name (``jsonschema/_keywords.py`` -> ``jsonschema``)."""
    if where.startswith("<"):
        return "python"
    head, sep, _ = where.partition("/")
    if not sep:
        return "app" if where.startswith(("digits_", "heavy_", "bench_models")) else "stdlib"
    return head


# -- report ----------------------------------------------------------------------------------------


def render_in_process(result: dict[str, Any], hidden: int) -> str:
    rows = [["model", "params", "forward b1 µs/sample", f"forward b{MAX_BATCH} µs/sample", "forward fall",
             "whole batch b1 µs/sample", f"whole batch b{MAX_BATCH} µs/sample", "whole batch fall"]]
    for kind in MODELS:
        r = result[kind]
        label = "digits (64-64-10)" if kind == "digits" else f"heavy (64-{hidden}-{hidden}-10)"
        b1f, bnf = r["forward_b1_us"], r[f"forward_b{MAX_BATCH}_us"]
        b1c, bnc = r["classify_b1_us"], r[f"classify_b{MAX_BATCH}_us"]
        rows.append([label, f"{r['params']:,}", f"{b1f:,.1f}", f"{bnf:,.1f}", f"{b1f / bnf:.1f}x",
                     f"{b1c:,.1f}", f"{bnc:,.1f}", f"{b1c / bnc:.1f}x"])
    return markdown_table(rows)


def _index(rows: list[Row]) -> dict[tuple[str, str, int], Row]:
    return {(r.model, r.mode, r.cell.concurrency): r for r in rows}


def _ordered(rows: list[Row]) -> list[Row]:
    order = {m: i for i, m in enumerate(MODES)}
    return sorted(rows, key=lambda r: (MODELS.index(r.model), order[r.mode], r.cell.concurrency))


def render_main(rows: list[Row]) -> str:
    by = _index(rows)
    table = [["target", "conc", "requests", "errors", "req/s", "p50 ms", "p95 ms", "p99 ms", "mean batch",
              "queue wait ms", "batch run ms", "req/s vs bare inline", "req/s vs unbatched", "p50 - bare p50 ms"]]
    for r in _ordered(rows):
        c = r.cell
        bare = by.get((r.model, "bare inline", c.concurrency))
        unbatched = by.get((r.model, "unbatched", c.concurrency))
        ember = r.mode != "bare inline"
        inside = r.replica_delta()
        table.append([
            r.name, str(c.concurrency), str(c.requests), str(c.errors), f"{c.rps:,.0f}",
            f"{c.percentile(50):.2f}", f"{c.percentile(95):.2f}", f"{c.percentile(99):.2f}",
            f"{c.mean_batch:.1f}" if ember else "-",
            _ms(inside["queue_wait_ms"]) if inside else "-", _ms(inside["run_ms"]) if inside else "-",
            f"{c.rps / bare.cell.rps:.2f}x" if ember and bare and bare.cell.rps else "-",
            f"{c.rps / unbatched.cell.rps:.2f}x" if r.mode == "batched" and unbatched and unbatched.cell.rps else "-",
            f"{c.percentile(50) - bare.cell.percentile(50):+.2f}" if ember and bare else "-",
        ])
    return markdown_table(table)


def render_cpu(rows: list[Row], procs: Processes) -> str:
    table = [["target", "conc", "load gen", "gateway", "nats", "agent", "replica or bare endpoint",
              "our other procs", "machine busy", "steal", "not ours", "gateway ms/req", "server ms/req",
              "all ours ms/req"]]
    for r in _ordered(rows):
        cpu, n = r.cpu, r.cell.requests
        ours_s = sum(cpu.spent.get(p, 0.0) for p in procs.all()) + cpu.gen_s
        named = [procs.gateway, procs.nats, procs.agent, *r.server_pids]
        other_ours = cpu.of([p for p in procs.all() if p not in named])
        ember = r.mode != "bare inline"

        def per_request(seconds: float, n: int = n) -> str:
            return f"{1000 * seconds / n:.2f}" if n else "-"

        table.append([
            r.name, str(r.cell.concurrency), _pct(cpu.share(cpu.gen_s)), _pct(cpu.of([procs.gateway])),
            _pct(cpu.of([procs.nats])), _pct(cpu.of([procs.agent])), _pct(cpu.of(r.server_pids)), _pct(other_ours),
            _pct(cpu.share(cpu.busy_s)), _pct(cpu.share(cpu.steal_s)), _pct(cpu.share(cpu.busy_s - ours_s)),
            per_request(cpu.spent.get(procs.gateway, 0.0)) if ember else "-",
            per_request(sum(cpu.spent.get(p, 0.0) for p in r.server_pids)),
            per_request(ours_s),
        ])
    return markdown_table(table)


def _ms(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "-"


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%" if math.isfinite(share) else "-"


def render_targets(rows: list[Row], in_process: dict[str, Any]) -> str:
    by = _index(rows)
    top, low = max(CONCURRENCIES), min(CONCURRENCIES)

    def rps(model: str, mode: str, conc: int) -> float:
        row = by.get((model, mode, conc))
        return row.cell.rps if row else math.nan

    def p50(model: str, mode: str, conc: int) -> float:
        row = by.get((model, mode, conc))
        return row.cell.percentile(50) if row else math.nan

    heavy = in_process["heavy"]
    checks = [
        (f"heavy: in-process per-sample cost, batch 1 / batch {MAX_BATCH} ({label})",
         heavy[f"{key}_b1_us"] / heavy[f"{key}_b{MAX_BATCH}_us"], TARGET_FALL, ">=", "x")
        for key, label in (("forward", "forward only"), ("classify", "whole batch"))
    ]
    checks += [
        (f"digits: batched / bare inline req/s at concurrency {top}",
         rps("digits", "batched", top) / rps("digits", "bare inline", top), TARGET_VS_BARE, ">=", "x"),
        (f"heavy: batched / unbatched req/s at concurrency {top}",
         rps("heavy", "batched", top) / rps("heavy", "unbatched", top), TARGET_VS_UNBATCHED, ">=", "x"),
        (f"digits: batched p50 - bare inline p50 at concurrency {low}",
         p50("digits", "batched", low) - p50("digits", "bare inline", low), TARGET_P50_DELTA_MS, "<=", " ms"),
    ]
    table = [["check", "measured", "target", "met"]]
    for label, value, goal, op, unit in checks:
        met = value >= goal if op == ">=" else value <= goal
        table.append([label, f"{value:.2f}{unit}", f"{op} {goal:g}{unit}", "yes" if met else "no"])
    # Context the targets do not ask for, from the same run.
    table.append([f"(info) heavy: batched / bare inline req/s at concurrency {top}",
                  f"{rps('heavy', 'batched', top) / rps('heavy', 'bare inline', top):.2f}x", "-", "-"])
    table.append([f"(info) digits: batched / unbatched req/s at concurrency {top}",
                  f"{rps('digits', 'batched', top) / rps('digits', 'unbatched', top):.2f}x", "-", "-"])
    table.append([f"(info) heavy: batched p50 - bare inline p50 at concurrency {low}",
                  f"{p50('heavy', 'batched', low) - p50('heavy', 'bare inline', low):.2f} ms", "-", "-"])
    return markdown_table(table)


# -- setup and teardown ----------------------------------------------------------------------------


def deploy_all(url: str, files: list[Path]) -> None:
    """Upload all four apps, then wait until each has its replica ready (they start in parallel)."""
    import ember
    from ember._client import Transport
    from ember._deploy import wait_ready

    transport = Transport(url)
    try:
        versions = []
        for path in files:
            say(f"deploying {path.name}")
            view = ember.deploy(path, transport=transport, wait=False)
            versions.append((view.app, view.version))
        for app, version in versions:
            def progress(message: str, _view: object, app: str = app) -> None:
                say(f"{app}: {message}")

            wait_ready(transport, app, version, timeout_s=240, progress=progress)
    finally:
        transport.close()


def run(plan: Plan, hidden: int, profile_dir: Path | None, device: str = "cpu") -> None:
    from ember.dev.embedded import EmbeddedPlatform

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ember-bench-batching-"))
    app_dir = work / "apps"
    platform = EmbeddedPlatform(work / "state", http_port=0)
    bare: dict[str, subprocess.Popen[bytes]] = {}
    keep_logs = False
    try:
        files = write_apps(app_dir, hidden, device)
        say(f"measuring both models in-process on {device} (batch 1 and {MAX_BATCH}, one thread)")
        in_process = run_in_process_child(app_dir, device)
        print(f"## In-process cost per sample on {device} (torch {in_process['torch']}, "
              f"{in_process['threads']} thread(s))\n")
        print(render_in_process(in_process, hidden), flush=True)
        heavy = in_process["heavy"]
        fall = heavy["classify_b1_us"] / heavy[f"classify_b{MAX_BATCH}_us"]
        if fall < TARGET_FALL:
            say(f"note: the heavy model's per-sample cost falls only {fall:.1f}x from batch 1 to {MAX_BATCH} "
                f"here (the issue asks for >= {TARGET_FALL:g}x); try another --hidden")

        say(f"starting the platform in {platform.state_dir}")
        platform.start()
        os.environ["EMBER_TOKEN"] = platform.token  # for the SDK's transport and the load generator
        deploy_all(platform.url, files)
        procs = Processes(gateway=platform._procs["platform"].pid, nats=platform._procs["nats"].pid,
                          agent=platform._procs["agent"].pid)
        bare_urls = {}
        for model in MODELS:
            say(f"starting the bare inline {model} endpoint")
            bare[model], bare_urls[model] = start_inline_server(model, app_dir, device)
            procs.bare[model] = bare[model].pid
        bodies = sample_bodies()
        targets = {}
        for model in MODELS:
            targets[model, "bare inline"] = Target(f"{model} bare inline", f"{bare_urls[model]}/predict", bodies,
                                                   is_ember=False, token="")
            for mode in ("batched", "unbatched"):
                targets[model, mode] = Target(f"{model} {mode}",
                                              f"{platform.url}/v1/{app_name(model, mode)}/Classifier.predict",
                                              bodies, is_ember=True)
        if profile_dir is not None:
            profile_dir.mkdir(parents=True, exist_ok=True)
        say(f"pids: gateway {procs.gateway}, nats {procs.nats}, agent {procs.agent}, bare {procs.bare}")
        rows = ember_loop.run(measure_all(targets, plan, procs, platform.url, profile_dir))

        print(f"\n## Over HTTP (closed loop; {plan.warmup_s:g} s warm-up, {plan.measure_s:g} s window per cell)\n")
        print(render_main(rows))
        print("\n## CPU over each measured window (100% = one core; the machine has "
              f"{os.cpu_count()})\n")
        print(render_cpu(rows, procs))
        print("\n## The issue's targets\n")
        print(render_targets(rows, in_process))
        for row in rows:
            for role, path in row.profile.items():
                print(f"\n## py-spy: {row.name} at concurrency {row.cell.concurrency}, {role} (pid "
                      f"{procs.gateway if role == 'gateway' else row.server_pids[0]})\n")
                print(summarize_profile(path))
        say(f"done in {time.monotonic() - started:.0f} s")
    except BaseException:
        keep_logs = True
        raise
    finally:
        say("stopping")
        for proc in bare.values():
            stop_process(proc)
        platform.stop()
        if keep_logs:
            say(f"logs kept in {platform.log_dir}")
            shutil.rmtree(app_dir, ignore_errors=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows, for a smoke run")
    parser.add_argument("--hidden", type=int, default=DEFAULT_HIDDEN,
                        help=f"hidden width of the heavy model (default {DEFAULT_HIDDEN})")
    parser.add_argument("--py-spy", type=Path, metavar="DIR", dest="py_spy",
                        help="profile the gateway and replicas at concurrency 1 and 64 into DIR (perturbs the numbers)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the models run: every replica and both bare endpoints (cuda: the four apps "
                             f"share one GPU, {GPU_SHARE} each)")
    parser.add_argument("--serve-inline", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--measure-in-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--app-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_inline:
        serve_inline(args.serve_inline, args.app_dir, args.device)
        return
    if args.measure_in_process:
        measure_in_process(args.app_dir, args.device)
        return
    if args.py_spy is not None and py_spy_binary() is None:
        parser.error("--py-spy needs py-spy (pip install py-spy)")
    run_interruptible(lambda: run(QUICK if args.quick else FULL, args.hidden, args.py_spy, args.device))


if __name__ == "__main__":
    main()
