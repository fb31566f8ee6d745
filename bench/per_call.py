"""Speed per call: Ember next to the floor (one bare Starlette + uvicorn process calling the model inline).

What is measured
    The floor is one uvicorn process (the settings of Ember's gateway) serving ``POST /echo`` (returns the
    body) and ``POST /mlp`` (the MLP of bench/apps/per_call/mlp.py, 256 -> 1024 -> 1024 -> 10, one torch
    thread, called inline). Ember serves bench/apps/per_call/per_call.py: ``echo`` (unbatched), ``Batched.predict``
    (``batch=ember.Batch(max_size=32, window_ms=5)``) and ``Unbatched.predict``, each on its own replica.

    Five targets (floor echo, floor MLP, Ember echo, Ember batched MLP, Ember unbatched MLP) are measured at
    concurrency 1 (p50) and 64 (req/s) with http_latency.py's raw-asyncio closed-loop client, in ``--rounds``
    rounds whose order alternates (the second round runs the targets in reverse order); the table gives the
    medians over the rounds. Server CPU per call is the CPU time (``/proc/<pid>/stat``) over each window of
    every Ember process together (gateway/control plane, nats-server, node agent, all three replicas) against
    the floor's one process, divided by the calls of the window.

    Then, without traffic, Ember's idle CPU over ``--idle-s`` seconds, per process (the issue's figure is
    control plane + agent + nats-server + one replica); then ``--spawn N`` queued calls of ``Batched.predict``
    submitted through ``POST .../spawn`` (bench/queues.py's submitter) and read back: calls/s from the first
    submit to the last stored result (the records' own ``updated_at``). Only the last call is long-polled while
    the queue drains, and every record is read once it is final: unlike bench/queues.py, whose readers poll every
    call as it goes, the reading takes no CPU from the path it measures (``--read-while`` reads as queues.py does).
    Then ``--events N`` queued calls from events: JetStream publishes to the subject ``on_vectors`` (the same
    batched MLP) is bound to, timed from the first publish to the last result (bench/queued_rate.py).

    ``--stages N`` (default 2,000; 0 skips) then splits each Ember target's p50 at c=1 into the floor's HTTP, the
    model, the NATS hop, the replica and the gateway: N calls to each of the five targets over HTTP, straight to each
    replica over NATS and to a bare NATS responder, interleaved in blocks of 25 (bench/call_stages.py).

    ``--profile DIR`` adds, after the rounds, one py-spy window (``py-spy record``, 200 Hz, raw) on the
    gateway and on the replica of each Ember target at concurrency 1 and 64, and prints where the samples
    went: by package, hottest functions, and the replica's event loop against its executor thread(s). The
    replica is sampled with ``--gil`` (the thread holding the GIL), because py-spy cannot tell its idle threads
    from busy ones inside the sandbox's pid namespace; the ``/proc`` CPU figures of the table stay exact.

    The machine's load average (``/proc/loadavg``) is printed before and after: on a shared machine the
    ratios of one interleaved run are more robust than the absolute figures.

Usage
    python bench/per_call.py [--quick] [--rounds R] [--spawn N] [--events N] [--idle-s S] [--stages N] [--profile DIR]
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
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import call_stages  # noqa: E402  (bench/ is not a package)
import http_latency  # noqa: E402
import queued_rate  # noqa: E402
from batching import CpuWindow, Processes, deploy_all, proc_cpu_s, py_spy_binary  # noqa: E402
from http_latency import (  # noqa: E402
    Target,
    markdown_table,
    run_interruptible,
    say,
    serve_routes,
    stop_process,
    wait_until_listening,
)

APP_DIR = BENCH / "apps" / "per_call"
APP = "percall"
WIDTH_IN = 256
ECHO_BODY = json.dumps({"message": "hello", "n": 42}).encode()
SAMPLE_COUNT = 16
CONCURRENCY = (1, 64)

FULL = http_latency.Plan(warmup_s=0.5, measure_s=3.0, max_requests=30_000)
QUICK = http_latency.Plan(warmup_s=0.3, measure_s=1.5, max_requests=10_000)


def mlp_bodies() -> list[bytes]:
    import random

    rng = random.Random(0)
    return [json.dumps({"values": [round(rng.uniform(-1, 1), 4) for _ in range(WIDTH_IN)]}).encode()
            for _ in range(SAMPLE_COUNT)]


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# -- the floor (a child process) -------------------------------------------------------------------


def serve_floor() -> None:
    """``POST /echo`` and ``POST /mlp`` (inline, one call at a time) on a free loopback port; print the port."""
    sys.path.insert(0, str(APP_DIR))
    import msgspec
    from mlp import Mlp, Vector
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    mlp = Mlp()
    decode = msgspec.json.Decoder(Vector).decode
    encode = msgspec.json.Encoder().encode

    async def echo(request: Request) -> Response:
        return Response(await request.body(), media_type="application/json")

    async def predict(request: Request) -> Response:
        try:
            vector = decode(await request.body())
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return Response(encode({"error": str(exc)}), status_code=422, media_type="application/json")
        return Response(encode(mlp.classify([vector])[0]), media_type="application/json")

    serve_routes([Route("/echo", echo, methods=["POST"]), Route("/mlp", predict, methods=["POST"])])


def start_floor() -> tuple[subprocess.Popen[bytes], str]:
    from ember._procs import die_with_parent

    proc = subprocess.Popen([sys.executable, __file__, "--serve-floor"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        stop_process(proc)
        raise RuntimeError("the floor did not start")
    url = f"http://127.0.0.1:{int(line)}"
    wait_until_listening(url)
    return proc, url


# -- measuring -------------------------------------------------------------------------------------


@dataclass
class Side:
    """One target's figures over the rounds."""

    target: Target
    pids: list[int]  # whose CPU is the server's
    roles: dict[str, list[int]] = field(default_factory=dict)  # Ember's share of it, by process role
    p50_ms: list[float] = field(default_factory=list)
    rps: list[float] = field(default_factory=list)
    cpu_ms: dict[int, list[float]] = field(default_factory=lambda: {c: [] for c in CONCURRENCY})
    errors: int = 0
    batch: list[float] = field(default_factory=list)  # mean X-Ember-Batch-Size at 64
    by_role: dict[tuple[str, int], list[float]] = field(default_factory=dict)  # (role, concurrency) -> ms/call


async def measure_side(side: Side, plan: http_latency.Plan, procs: Processes) -> None:
    for concurrency in CONCURRENCY:
        cpu = CpuWindow(procs)
        cpu.start()
        cell = await http_latency.measure(side.target, concurrency, plan)
        cpu.stop()
        side.errors += cell.errors
        calls = max(cell.requests, 1)
        side.cpu_ms[concurrency].append(1000 * sum(cpu.spent.get(p, 0.0) for p in side.pids) / calls)
        for role, pids in side.roles.items():
            side.by_role.setdefault((role, concurrency), []).append(
                1000 * sum(cpu.spent.get(p, 0.0) for p in pids) / calls)
        if concurrency == 1:
            side.p50_ms.append(cell.percentile(50))
        else:
            side.rps.append(cell.rps)
            side.batch.append(cell.mean_batch)


async def measure_rounds(sides: list[Side], rounds: int, plan: http_latency.Plan, procs: Processes) -> None:
    for r in range(rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        for side in order:
            say(f"round {r + 1}/{rounds}: {side.target.name}")
            await measure_side(side, plan, procs)


def med(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def render(sides: dict[str, Side]) -> str:
    f_echo, f_mlp = sides["floor echo"], sides["floor MLP"]
    e_echo, e_b, e_u = sides["Ember echo"], sides["Ember batched MLP"], sides["Ember unbatched MLP"]
    rows = [["cell", "floor", "Ember", "ratio / gap", "goal"]]

    def p50(label: str, floor: Side, ember: Side, goal: str) -> None:
        f, e = med(floor.p50_ms), med(ember.p50_ms)
        rows.append([label, f"{f:.2f} ms", f"{e:.2f} ms", f"{e - f:+.2f} ms", goal])

    def rps(label: str, floor: Side, ember: Side, goal: str) -> None:
        f, e = med(floor.rps), med(ember.rps)
        rows.append([label, f"{f:,.0f}", f"{e:,.0f}", f"{e / f:.2f}x", goal])

    def cpu(label: str, floor: Side, ember: Side, concurrency: int) -> None:
        f, e = med(floor.cpu_ms[concurrency]), med(ember.cpu_ms[concurrency])
        rows.append([label, f"{f:.2f} ms", f"{e:.2f} ms", f"{e / f:.2f}x", "-"])

    p50("echo, p50 at c=1", f_echo, e_echo, "+0.40 ms")
    p50("batched MLP, p50 at c=1", f_mlp, e_b, "+0.50 ms")
    p50("unbatched MLP, p50 at c=1", f_mlp, e_u, "+0.50 ms")
    rps("echo (unbatched), req/s at c=64", f_echo, e_echo, "0.8x")
    rps("unbatched MLP, req/s at c=64", f_mlp, e_u, "0.7x")
    rps("batched MLP, req/s at c=64", f_mlp, e_b, "1.5x")
    for concurrency in CONCURRENCY:
        cpu(f"echo, server CPU per call at c={concurrency}", f_echo, e_echo, concurrency)
        cpu(f"unbatched MLP, server CPU per call at c={concurrency}", f_mlp, e_u, concurrency)
        cpu(f"batched MLP, server CPU per call at c={concurrency}", f_mlp, e_b, concurrency)
    return markdown_table(rows)


def render_roles(sides: dict[str, Side]) -> str:
    """Ember's server CPU per call by process, medians over the rounds."""
    ember = [s for s in sides.values() if s.roles]
    roles = list(ember[0].roles) if ember else []
    rows = [["target", "conc", *roles, "all"]]
    for side in ember:
        for concurrency in CONCURRENCY:
            rows.append([side.target.name, str(concurrency),
                         *(f"{med(side.by_role[(r, concurrency)]):.3f}" for r in roles),
                         f"{med(side.cpu_ms[concurrency]):.3f}"])
    return markdown_table(rows)


# -- idle CPU --------------------------------------------------------------------------------------


def idle_cpu(roles: dict[str, int], seconds: float) -> str:
    before = {name: proc_cpu_s(pid) for name, pid in roles.items()}
    start = time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - start
    after = {name: proc_cpu_s(pid) for name, pid in roles.items()}
    share = {name: 100 * ((after[name] or 0.0) - (before[name] or 0.0)) / wall for name in roles}
    replicas = [v for k, v in share.items() if k.startswith("replica")]
    base = sum(v for k, v in share.items() if not k.startswith("replica"))
    lines = [f"Idle CPU over {wall:.1f} s, % of one core: "
             + ", ".join(f"{name} {v:.2f}" for name, v in share.items())]
    if replicas:
        lines.append(f"control plane + agent + nats-server + one replica (the mean of {len(replicas)}): "
                     f"{base + statistics.mean(replicas):.2f} % of a core (goal: under 2 %)")
    return "\n".join(lines)


# -- queued calls ----------------------------------------------------------------------------------


# -- profiles --------------------------------------------------------------------------------------


EXECUTOR_FRAME = "_worker (concurrent/futures/thread.py"


def start_spy(pid: int, duration_s: float, path: Path, gil: bool) -> subprocess.Popen[bytes]:
    """``py-spy record`` of ``pid``. ``gil``: only the thread holding the GIL (py-spy cannot tell idle threads of a
    sandboxed replica, in its own pid namespace, from busy ones; native code that releases the GIL, such as
    torch's kernels, is then not seen)."""
    from ember._procs import die_with_parent

    binary = py_spy_binary()
    assert binary is not None
    cmd = [binary, "record", "--pid", str(pid), "--duration", str(math.ceil(duration_s)), "--rate", "200",
           "--format", "raw", "--nonblocking", "--output", str(path), *(["--gil"] if gil else [])]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=die_with_parent)


def summarize(path: Path, duration_s: float, top: int = 12) -> str:
    """Where a py-spy raw profile's samples went: CPU share (of one core, at 200 Hz) by package, the event loop
    against the executor threads, and the hottest functions by self time."""
    if not path.exists():
        return f"  (no profile at {path})"
    by_package: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    executor = total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        executor += count * any(EXECUTOR_FRAME in f for f in frames)
        name, _, where = frames[-1].partition(" (")
        where = where.rstrip(")").rsplit(":", 1)[0]
        by_package[where.split("/")[0] if "/" in where else where] += count
        self_time[f"{name} ({where})"] += count
    if not total:
        return "  (no samples)"
    core = 200 * duration_s

    def pct(n: int) -> str:
        return f"{100 * n / total:4.1f}%"

    lines = [f"  {total} samples = {100 * total / core:.0f}% of a core; executor thread(s) {pct(executor)}, "
             f"the rest (event loop, other threads) {pct(total - executor)}",
             "  by package (self): " + ", ".join(f"{k} {pct(n)}" for k, n in by_package.most_common(8)),
             "  hottest (self):"]
    lines += [f"    {pct(n)} {name}" for name, n in self_time.most_common(top)]
    return "\n".join(lines)


async def profile(sides: list[Side], plan: http_latency.Plan, procs: Processes, replica_of: dict[str, int],
                  folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    duration = plan.warmup_s + plan.measure_s + 1.0
    for side in sides:
        for concurrency in CONCURRENCY:
            say(f"profiling {side.target.name} at concurrency {concurrency}")
            files = {}
            spies = []
            for role, pid in (("gateway", procs.gateway), ("replica", replica_of[side.target.name])):
                files[role] = folder / f"{side.target.name.replace(' ', '_')}-c{concurrency}-{role}.txt"
                spies.append(start_spy(pid, duration, files[role], gil=role == "replica"))
            await asyncio.sleep(0.3)
            started = time.perf_counter()
            cell = await http_latency.measure(side.target, concurrency, plan)
            elapsed = time.perf_counter() - started
            for spy in spies:
                await asyncio.to_thread(spy.wait, 60)
            out.append(f"### {side.target.name}, concurrency {concurrency} ({cell.requests:,} calls, "
                       f"{cell.rps:,.0f} req/s under the profiler)")
            for role, path in files.items():
                out.append(f"{role}:\n{summarize(path, elapsed)}")
    return "\n".join(out)


# -- the run ---------------------------------------------------------------------------------------


def replica_ids(url: str) -> dict[str, str]:
    """Service name -> the id of its ready replica (of the current version)."""
    import httpx
    from http_latency import auth_headers

    view = httpx.get(f"{url}/v1/apps/{APP}", timeout=10, headers=auth_headers()).json()
    return {service["name"]: replica["replica_id"] for service in view["services"] for replica in service["replicas"]
            if replica["state"] == "ready" and replica["version"] == view["version"]}


def service_pids(url: str) -> dict[str, int]:
    """Function name -> the pid of its ready replica (of the current version)."""
    import httpx
    from http_latency import auth_headers

    view = httpx.get(f"{url}/v1/apps/{APP}", timeout=10, headers=auth_headers()).json()
    out = {}
    for service in view["services"]:
        for replica in service["replicas"]:
            if replica["state"] == "ready" and replica["version"] == view["version"]:
                out[service["name"]] = replica["pid"]
    return out


def run(plan: http_latency.Plan, args: argparse.Namespace) -> None:
    from ember.dev.embedded import EmbeddedPlatform

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ember-bench-per-call-"))
    platform = EmbeddedPlatform(work / "state", http_port=0)
    floor = None
    keep_logs = False
    try:
        say(f"starting the platform in {platform.state_dir}")
        platform.start()
        os.environ["EMBER_TOKEN"] = platform.token
        deploy_all(platform.url, [APP_DIR / "per_call.py"])
        floor, floor_url = start_floor()
        by_service = service_pids(platform.url)
        say(f"replicas: {by_service}")
        procs = Processes(gateway=platform._procs["platform"].pid, nats=platform._procs["nats"].pid,
                          agent=platform._procs["agent"].pid, bare={"floor": floor.pid},
                          replicas={APP: list(by_service.values())})
        ember_pids = [procs.gateway, procs.nats, procs.agent, *by_service.values()]
        url, mlp = platform.url, mlp_bodies()
        targets = [
            Side(Target("floor echo", f"{floor_url}/echo", [ECHO_BODY], is_ember=False, token=""), [floor.pid]),
            Side(Target("Ember echo", f"{url}/v1/{APP}/echo", [ECHO_BODY], is_ember=True), ember_pids),
            Side(Target("floor MLP", f"{floor_url}/mlp", mlp, is_ember=False, token=""), [floor.pid]),
            Side(Target("Ember batched MLP", f"{url}/v1/{APP}/Batched.predict", mlp, is_ember=True), ember_pids),
            Side(Target("Ember unbatched MLP", f"{url}/v1/{APP}/Unbatched.predict", mlp, is_ember=True),
                 ember_pids),
        ]
        replica_of = {"Ember echo": by_service.get("echo", 0),
                      "Ember batched MLP": by_service.get("Batched", 0),
                      "Ember unbatched MLP": by_service.get("Unbatched", 0)}
        for side in targets:
            if side.target.is_ember:
                own = replica_of[side.target.name]
                side.roles = {"gateway": [procs.gateway], "nats-server": [procs.nats], "replica": [own],
                              "agent, other replicas": [procs.agent, *(p for p in by_service.values() if p != own)]}
        load_before = load_average()
        from ember import _loop as ember_loop

        ember_loop.run(measure_rounds(targets, args.rounds, plan, procs))
        load_after = load_average()
        sides = {s.target.name: s for s in targets}
        if args.rounds > 0:
            print(f"## Per call: Ember against the floor ({os.cpu_count()} CPUs, load average {load_before} before, "
                  f"{load_after} after; {args.rounds} interleaved rounds, medians; {plan.warmup_s:g} s warm-up + "
                  f"{plan.measure_s:g} s window per cell)\n")
            print(render(sides), flush=True)
            errors = {name: s.errors for name, s in sides.items() if s.errors}
            batches = ", ".join(f"{n} {med(s.batch):.1f}" for n, s in sides.items() if s.target.is_ember)
            print(f"\nmean batch at c=64: {batches}" + (f"; errors {errors}" if errors else ""))
            print("\nEmber's server CPU per call by process, ms (medians):\n\n" + render_roles(sides), flush=True)
        if args.stages > 0:
            say(f"stages: {args.stages:,} calls to each target, each replica alone and a bare NATS responder")
            ids = replica_ids(platform.url)
            alone = call_stages.measure(platform.nats_url, platform.auth_dir, {
                "Ember echo": (ids["echo"], "echo", ECHO_BODY),
                "Ember batched MLP": (ids["Batched"], "Batched.predict", mlp[0]),
                "Ember unbatched MLP": (ids["Unbatched"], "Unbatched.predict", mlp[0])},
                {side.target.name: side.target for side in targets}, args.stages)
            rows = call_stages.render(alone, {"Ember echo": "floor echo", "Ember batched MLP": "floor MLP",
                                              "Ember unbatched MLP": "floor MLP"}, "floor echo")
            print("\n## Where a lone call's time goes (p50 at c=1, ms, interleaved in blocks; see "
                  "bench/call_stages.py)\n\n" + markdown_table(rows), flush=True)
        if args.idle_s > 0:
            say(f"idle CPU over {args.idle_s:g} s")
            time.sleep(2.0)
            roles = {"control plane": procs.gateway, "agent": procs.agent, "nats-server": procs.nats}
            roles |= {f"replica {name}": pid for name, pid in by_service.items()}
            spy = None
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
                spy = start_spy(procs.gateway, args.idle_s, args.profile / "idle-control-plane.txt", gil=False)
            print("\n" + idle_cpu(roles, args.idle_s), flush=True)
            if spy is not None:
                spy.wait(60)
                print("control plane, idle (py-spy):\n" + summarize(args.profile / "idle-control-plane.txt",
                                                                    args.idle_s), flush=True)
        share = {"gateway": [procs.gateway], "nats-server": [procs.nats], "replica": [by_service.get("Batched", 0)],
                 "the rest": [procs.agent, floor.pid]}
        if args.spawn > 0:
            say(f"spawn {args.spawn:,} calls")
            text = queued_cell(procs, share, queued_rate.spawn_rate(url, mlp_bodies(), args.spawn,
                                                                    args.submit_concurrency, args.read_while))
            print(f"\n{text}", flush=True)
        if args.events > 0:
            say(f"publish {args.events:,} events")
            share["replica"] = [by_service.get("on_vectors", 0)]
            text = queued_cell(procs, share, queued_rate.events_rate(platform.nats_url, platform.auth_dir, mlp_bodies(),
                                                                     args.events, args.submit_concurrency))
            print(f"\n{text}", flush=True)
        if args.profile is not None:
            ember_sides = [s for s in targets if s.target.is_ember]
            text = ember_loop.run(profile(ember_sides, plan, procs, replica_of, args.profile))
            print("\n## Profiles (py-spy, 200 Hz)\n\n" + text, flush=True)
        print(f"\nload average at the end: {load_average()}")
        say(f"done in {time.monotonic() - started:.0f} s")
    except BaseException:
        keep_logs = True
        raise
    finally:
        say("stopping")
        if floor is not None:
            stop_process(floor)
        platform.stop()
        if keep_logs:
            say(f"logs kept in {platform.log_dir}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def queued_cell(procs: Processes, share: dict[str, list[int]], cell: Coroutine[Any, Any, str]) -> str:
    """Run one queued cell (a coroutine of bench/queued_rate.py) and add the CPU its processes took."""
    cpu = CpuWindow(procs)
    cpu.start()
    text = asyncio.run(cell)
    cpu.stop()
    return (f"{text}\nCPU over the cell ({cpu.wall_s:.1f} s), share of one core: "
            + ", ".join(f"{k} {cpu.of(v):.2f}" for k, v in share.items())
            + f", this load generator {cpu.share(cpu.gen_s):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows, 1,000 spawned calls")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--spawn", type=int, default=None, metavar="N",
                        help="queued calls to spawn (default 10,000; --quick 1,000; 0 skips)")
    parser.add_argument("--events", type=int, default=None, metavar="N",
                        help="queued calls from events to publish (default: as --spawn; 0 skips)")
    parser.add_argument("--submit-concurrency", type=int, default=32, metavar="K")
    parser.add_argument("--read-while", action="store_true",
                        help="spawn: long-poll every call while the queue drains (as bench/queues.py does)")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle CPU window (0 skips)")
    parser.add_argument("--stages", type=int, default=2000, metavar="N",
                        help="after the rounds, N calls to each replica alone and to a bare NATS responder (0 skips)")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="py-spy each Ember target, raw files in DIR")
    parser.add_argument("--serve-floor", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_floor:
        serve_floor()
        return
    if args.spawn is None:
        args.spawn = 1_000 if args.quick else 10_000
    if args.events is None:
        args.events = args.spawn
    if args.profile is not None and py_spy_binary() is None:
        parser.error("--profile needs py-spy (pip install py-spy)")
    run_interruptible(lambda: run(QUICK if args.quick else FULL, args))


if __name__ == "__main__":
    main()
