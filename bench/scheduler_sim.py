"""Scheduler simulator: the real placement, autoscaling and rebalancing policies on a synthetic cluster.

Run from the repository root::

    .venv/bin/python bench/scheduler_sim.py           # 1,000 GPU nodes x 8 GPUs, 10,000 functions, 1 h
    .venv/bin/python bench/scheduler_sim.py --quick   # 100 nodes, 1,000 functions, 10 min

Node inventories are declared TOML parsed by ``ember_runtime.agent.inventory`` (the agent's own code
path); every decision comes from ``ember_platform.scheduler`` (``desired_replicas``,
``place_and_apply``, ``rebalance``, ``apply_decisions``). Only the load and the replicas' behaviour are
modelled here (the load is handed to the autoscaler as measured signals: arrival rate, per-replica
throughput, start-up time):

- load: per function a base rate (heavy-tailed), a compressed diurnal swing, per-tick noise, bursts
  (x4 for 5 min) and on/off functions that go idle (scale to zero and back);
- a replica serves ``throughput`` calls/s, is ready ``startup_s`` after it is bound (30% of that on a
  node caching its bundle), and calls queue as in an M/M/c queue (Sakasegawa's approximation); a call
  meets its target when its sojourn (waiting for a start-up, a backlog, the queue, service) does,
  with the sojourn taken as exponential around its mean;
- three GPU nodes are lost during the run; their replicas are placed again;
- rebalancing moves (``MOVES`` limits them) are make-before-break: the replacement starts at once, the
  replica it replaces stops at the first pass after the replacement is ready.

A reconcile pass, timed, is what a control loop runs every tick: ``desired_replicas`` for every
function, the diff against the replicas that exist, ``place_and_apply`` for the missing ones and the
scaled-down ones, then ``rebalance`` with what did not fit, and its moves applied. Reading the signals
(here, the load model) happens before the clock starts.
Wall time and this process's CPU time are both shown: on a shared machine the first includes
waiting for a CPU. Long-lived objects are moved out of the garbage collector's way after set-up
(``gc.freeze()``), as a control plane would do.

It prints one Markdown table. The packing benchmark places shared-GPU replicas (1-40 GB, any MB)
into the empty cluster in one pass and compares the memory of the GPUs used with the lower bound
(the memory asked for).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

from ember.wire import NodeInfo
from ember_platform.scheduler import (
    AutoscaleConfig,
    AutoscaleState,
    Binding,
    Cluster,
    Decision,
    GpuRequest,
    Move,
    MoveBudget,
    PlacementRequest,
    Priority,
    Reservation,
    Signals,
    Snapshot,
    apply_decisions,
    build_snapshot,
    desired_replicas,
    initial_state,
    place,
    place_and_apply,
    rebalance,
)
from ember_runtime.agent.inventory import parse

H100 = 'nvlink = [[0, 1, 2, 3, 4, 5, 6, 7]]\n' + ''.join(
    f'[[gpu]]\nmodel = "NVIDIA H100 80GB HBM3"\ncount = 4\nnuma_node = {n}\n' for n in (0, 1))
A100 = ('nvlink = [[0, 1, 2, 3, 4, 5]]\n[[gpu]]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 6\nnuma_node = 0\n'
        '[[gpu]]\nmodel = "NVIDIA A100-SXM4-80GB"\ncount = 2\nnuma_node = 1\nmig = { "1g.10gb" = 7 }\n')
L4 = ''.join(f'[[gpu]]\nmodel = "NVIDIA L4"\nmemory_gb = 24\ncount = 4\nnuma_node = {n}\n' for n in (0, 1))
A10G = '[[gpu]]\nmodel = "NVIDIA A10G"\nmemory_gb = 24\ncount = 8\nnuma_node = 0\n'
NODE_KINDS = [(H100, 0.20), (A100, 0.20), (L4, 0.35), (A10G, 0.25)]
CPU_NODE_SHARE = 0.05  # CPU-only nodes, besides the GPU nodes
SIZES_GB = [2, 4, 6, 8, 12, 16, 20, 24, 40]
SIZE_WEIGHTS = [8, 12, 10, 12, 10, 8, 5, 4, 3]
LN20 = math.log(20)
DEADLINE_S = 60.0
MOVES = MoveBudget(per_pass=4, per_hour=600)  # rebalancing: at most 4 moves started per pass, 600 an hour


@dataclass
class Fn:
    name: str
    gpu: GpuRequest
    priority: Priority
    config: AutoscaleConfig
    throughput: float  # calls/s per replica
    startup_s: float
    target_ms: float
    base_rate: float
    phase: float
    on_off: bool
    burst_at: float
    state: AutoscaleState
    bundle: str
    replicas: dict[str, float] = field(default_factory=dict)  # replica id -> ready at
    replacing: dict[str, str] = field(default_factory=dict)  # moves in flight: new replica id -> old one
    backlog: float = 0.0
    p95_ms: float | None = None


@dataclass
class Totals:
    calls: float = 0.0
    met: float = 0.0
    cold_calls: float = 0.0  # arriving while no replica of the function was ready
    cold_met: float = 0.0
    moved_preempted: int = 0
    moved_node_loss: int = 0
    moved_room: int = 0  # rebalancing moves started: room for a pending replica
    moved_spread: int = 0  # rebalancing moves started: spread
    bound: int = 0
    unschedulable: int = 0
    unschedulable_kinds: dict[str, int] = field(default_factory=dict)
    removed: int = 0
    passes: list[float] = field(default_factory=list)
    passes_cpu: list[float] = field(default_factory=list)  # CPU time of this process: robust to a busy machine
    autoscale: list[float] = field(default_factory=list)
    placing: list[float] = field(default_factory=list)
    rebalancing: list[float] = field(default_factory=list)
    placed_per_pass: list[int] = field(default_factory=list)


# --- the synthetic cluster and functions -----------------------------------------------------------


def make_nodes(count: int, rng: random.Random) -> list[NodeInfo]:
    kinds = [toml for toml, share in NODE_KINDS for _ in range(round(share * count))]
    rng.shuffle(kinds)
    nodes = [_node(f"g{i:04d}", toml, 128, 1024) for i, toml in enumerate(kinds[:count])]
    return nodes + [_node(f"c{i:03d}", "", 64, 256) for i in range(round(CPU_NODE_SHARE * count))]


def _node(node_id: str, toml: str, cores: int, memory_gb: int) -> NodeInfo:
    devices = parse(f'{toml}\n[host]\nname = "{node_id}"\ncpu_cores = {cores}\nmemory_gb = {memory_gb}\n')
    return NodeInfo(node_id=node_id, hostname=node_id, devices=devices, updated_at=0.0, cpu_cores=cores,
                    memory_mb=memory_gb * 1024)


def with_cached_bundles(nodes: list[NodeInfo], functions: int, rng: random.Random) -> list[NodeInfo]:
    return [NodeInfo(node_id=n.node_id, hostname=n.hostname, devices=n.devices, updated_at=0.0, cpu_cores=n.cpu_cores,
                     memory_mb=n.memory_mb, bundles=[f"b{rng.randrange(functions)}" for _ in range(20)])
            for n in nodes]


def make_gpu_request(rng: random.Random) -> GpuRequest:
    kind = rng.choices(["shared", "whole", "multi", "mig", "cpu"], [60, 10, 2, 8, 20])[0]
    if kind == "shared":
        types = rng.choice([(), (), (), ("L4", "A10G"), ("H100", "A100")])
        size = rng.choices(SIZES_GB, SIZE_WEIGHTS)[0]
        return GpuRequest(count=1, memory_mb=min(size, 20 if "L4" in types else size) * 1024, types=types)
    if kind == "whole":
        return GpuRequest(count=1, types=rng.choice([(), ("H100", "A100"), ("L4", "A10G"), ("A10G", "L4")]))
    if kind == "multi":
        types = rng.choice([("H100",), ("H100", "A100"), ("A100", "H100")])
        return GpuRequest(count=rng.choice([2, 2, 4, 8]), types=types,
                          topology="nvlink")
    if kind == "mig":
        return GpuRequest(count=1, mig_profile="1g.10gb")
    return GpuRequest()


def kind_of(gpu: GpuRequest) -> str:
    if gpu.cpu_only:
        return "cpu"
    if gpu.mig_profile:
        return "mig"
    return "multi" if gpu.count > 1 else "shared" if gpu.memory_mb else "whole"


def make_functions(count: int, rng: random.Random, horizon_s: float) -> list[Fn]:
    functions = []
    for i in range(count):
        gpu = make_gpu_request(rng)
        throughput = rng.uniform(5, 200) / max(gpu.count, 1)
        low = rng.choices([0, 1, 2], [70, 25, 5])[0]
        high = max(low, 1) + rng.choice([4, 9, 19, 49])
        config = AutoscaleConfig(min_replicas=low, max_replicas=high, buffer_replicas=rng.choice([0, 0, 0, 1]),
                                 target_in_flight=1.0, target_utilization=0.7,
                                 target_p95_ms=10_000 / throughput, scaledown_window_s=120)
        functions.append(Fn(
            name=f"app{i // 4}.fn{i}", gpu=gpu, priority="batch" if rng.random() < 0.25 else "interactive",
            config=config, throughput=throughput, startup_s=rng.uniform(5, 60), target_ms=10_000 / throughput,
            base_rate=throughput * 0.7 * min(rng.lognormvariate(-2.0, 1.2), high / 2), phase=rng.random(),
            on_off=rng.random() < 0.3, burst_at=rng.uniform(0, horizon_s) if rng.random() < 0.02 else -1.0,
            state=initial_state(config), bundle=f"b{i}"))
    return functions


def rate_at(fn: Fn, t: float, rng: random.Random) -> float:
    if fn.on_off and math.sin(2 * math.pi * (t / 1200 + fn.phase)) < 0:
        return 0.0
    diurnal = 1 + 0.4 * math.sin(2 * math.pi * (t / 3600 + fn.phase))
    burst = 4.0 if 0 <= t - fn.burst_at < 300 else 1.0
    return fn.base_rate * diurnal * burst * rng.uniform(0.85, 1.15)


# --- one reconcile pass: the code a control loop would run -----------------------------------------


class Sim:
    def __init__(self, nodes: list[NodeInfo], functions: list[Fn], tick_s: float, seed: int) -> None:
        self.nodes = nodes
        self.functions = functions
        self.by_name = {fn.name: fn for fn in functions}
        self.tick_s = tick_s
        self.rng = random.Random(seed)
        self.snapshot: Snapshot = build_snapshot(Cluster.from_nodes(nodes))
        self.totals = Totals()
        self.ids = 0
        self.templates = {fn.name: PlacementRequest(replica_id="", function=fn.name, gpu=fn.gpu, cpu_millis=2000,
                                                    host_memory_mb=8192, priority=fn.priority, bundle=fn.bundle)
                          for fn in functions}
        self.budget = MOVES
        self.moves: dict[str, Move] = {}  # moves in flight, by the new replica's id
        self.moving: set[str] = set()  # both ends of every move in flight
        self.finished = 0  # moves finished at the start of this pass

    def reconcile(self, now: float, rates: list[float]) -> None:
        """One pass of the control loop; the signals (the loop's input) are read before the clock starts."""
        removed = self.finish_moves(now)
        signals = [self.signals(fn, now, rate) for fn, rate in zip(self.functions, rates, strict=True)]
        started, started_cpu = time.perf_counter(), time.process_time()
        counts = []
        for fn, sig in zip(self.functions, signals, strict=True):
            count, fn.state = desired_replicas(sig, fn.config, fn.state)
            counts.append(count)
        scaled = time.perf_counter()
        wanted: list[PlacementRequest] = []
        for fn, count in zip(self.functions, counts, strict=True):
            if count != len(fn.replicas) - len(fn.replacing):
                self.diff(fn, count, now, wanted, removed)
        before = self.snapshot
        decisions, self.snapshot = place_and_apply(before, wanted, removed)
        placed = time.perf_counter()
        moves = self.rebalance(decisions, wanted, now)
        owners = {v: before.reservations[v].function for d in decisions if isinstance(d, Binding) for v in d.preempts}
        done, done_cpu = time.perf_counter(), time.process_time()
        self.record(decisions, owners, now)
        self.start_moves(moves, now)
        t = self.totals
        t.passes.append(done - started)
        t.passes_cpu.append(done_cpu - started_cpu)
        t.autoscale.append(scaled - started)
        t.placing.append(placed - scaled)
        t.rebalancing.append(done - placed)
        t.placed_per_pass.append(len(wanted))
        t.removed += len(removed) - self.finished

    def rebalance(self, decisions: list[Decision], wanted: list[PlacementRequest], now: float) -> list[Move]:
        """Moves for this pass (room for what did not fit, then spread), within the budget; applied at once."""
        budget = self.budget.available(now)
        if not budget:
            return []
        helped = {m.room_for for m in self.moves.values()}  # room is on its way for these
        pending = [w for w, d in zip(wanted, decisions, strict=True)
                   if not isinstance(d, Binding) and w.function not in helped]

        def movable(r: Reservation) -> bool:
            return r.replica_id not in self.moving and self.by_name[r.function].replicas.get(r.replica_id, now) < now

        moves = rebalance(self.snapshot, pending, self.templates, movable, lambda _: self.new_id(), budget)
        if moves:
            self.snapshot = apply_decisions(self.snapshot, [m.binding for m in moves])
            self.budget = self.budget.spend(now, len(moves))
        return moves

    def new_id(self) -> str:
        self.ids += 1
        return f"r{self.ids}"

    def start_moves(self, moves: list[Move], now: float) -> None:
        cluster = self.snapshot.cluster
        for move in moves:
            fn, new = self.by_name[move.binding.function], move.binding.replica_id
            local = fn.bundle in cluster.nodes[cluster.node_index[move.binding.node_id]].bundles
            fn.replicas[new] = now + fn.startup_s * (0.3 if local else 1.0)
            fn.replacing[new] = move.replica_id
            self.moves[new] = move
            self.moving |= {new, move.replica_id}
            if move.reason == "room":
                self.totals.moved_room += 1
            else:
                self.totals.moved_spread += 1

    def finish_moves(self, now: float) -> list[str]:
        """Old replicas whose replacement is ready stop (make-before-break); moves that lost an end are dropped."""
        removed = []
        for new, move in list(self.moves.items()):
            fn, old = self.by_name[move.binding.function], move.replica_id
            if new in fn.replicas and old in fn.replicas and fn.replicas[new] > now:
                continue  # still starting
            if new in fn.replicas and old in fn.replicas:
                del fn.replicas[old]
                removed.append(old)
            del self.moves[new], fn.replacing[new]
            self.moving -= {new, old}
        self.finished = len(removed)
        return removed

    def signals(self, fn: Fn, now: float, rate: float) -> Signals:
        ready = sum(1 for at in fn.replicas.values() if at <= now)
        busy = min(rate / fn.throughput, ready)
        durable = fn.priority == "batch"
        starting = len(fn.replicas) - ready - len(fn.replacing)  # a replacement adds no capacity
        return Signals(now=now, ready=ready, starting=starting, arrival_rate=rate,
                       in_flight=round(busy), queue_depth=0 if durable else round(fn.backlog),
                       durable_pending=round(fn.backlog) if durable else 0, throughput_per_replica=fn.throughput,
                       p95_ms=fn.p95_ms, startup_s=fn.startup_s)

    def diff(self, fn: Fn, count: int, now: float, wanted: list[PlacementRequest], removed: list[str]) -> None:
        have = len(fn.replicas) - len(fn.replacing)
        for _ in range(count - have):
            wanted.append(PlacementRequest(replica_id=self.new_id(), function=fn.name, gpu=fn.gpu,
                                           cpu_millis=2000, host_memory_mb=8192, priority=fn.priority,
                                           bundle=fn.bundle))
        if count < have:  # newest ready replicas first; never one that is still starting or moving
            ready = sorted((rid for rid, at in fn.replicas.items() if at <= now and rid not in self.moving),
                           key=lambda r: -int(r[1:]))
            for rid in ready[:have - count]:
                del fn.replicas[rid]
                removed.append(rid)

    def record(self, decisions: list[Decision], owners: dict[str, str], now: float) -> None:
        cluster = self.snapshot.cluster
        for d in decisions:
            if not isinstance(d, Binding):
                self.totals.unschedulable += 1
                kind = kind_of(self.by_name[d.function].gpu)
                self.totals.unschedulable_kinds[kind] = self.totals.unschedulable_kinds.get(kind, 0) + 1
                continue
            fn = self.by_name[d.function]
            local = fn.bundle in cluster.nodes[cluster.node_index[d.node_id]].bundles
            fn.replicas[d.replica_id] = now + fn.startup_s * (0.3 if local else 1.0)
            self.totals.bound += 1
            for victim in d.preempts:
                self.by_name[owners[victim]].replicas.pop(victim, None)
                self.totals.moved_preempted += 1

    def lose_node(self, now: float) -> float:
        """A GPU node stops reporting: rebuild the cluster and the snapshot; its replicas are re-placed."""
        gpu_nodes = [n for n in self.nodes if n.node_id.startswith("g")]
        gone = self.rng.choice(gpu_nodes).node_id
        started = time.perf_counter()
        self.nodes = [n for n in self.nodes if n.node_id != gone]
        self.snapshot = build_snapshot(Cluster.from_nodes(self.nodes), self.snapshot.reservations.values())
        elapsed = time.perf_counter() - started
        for orphan in self.snapshot.orphans:  # the next pass places replacements
            self.by_name[orphan.function].replicas.pop(orphan.replica_id, None)
            self.totals.moved_node_loss += 1
        return elapsed

    def serve(self, now: float, rates: list[float]) -> None:
        """The modelled replicas serve one tick of calls."""
        for fn, rate in zip(self.functions, rates, strict=True):
            calls = rate * self.tick_s
            ready = sum(1 for at in fn.replicas.values() if at <= now)
            mean_s = self.sojourn(fn, rate, ready, now)
            capacity = ready * fn.throughput * self.tick_s
            fn.backlog = max(fn.backlog + calls - capacity, 0.0)
            if fn.priority == "interactive":  # synchronous calls give up after their deadline
                fn.backlog = min(fn.backlog, rate * DEADLINE_S)
            fn.p95_ms = LN20 * mean_s * 1000 if calls else None
            met = calls * (1 - math.exp(-fn.target_ms / 1000 / mean_s)) if calls else 0.0
            self.totals.calls += calls
            self.totals.met += met
            if not ready:
                self.totals.cold_calls += calls
                self.totals.cold_met += met

    def sojourn(self, fn: Fn, rate: float, ready: int, now: float) -> float:
        service = 1 / fn.throughput
        if ready == 0:
            starts = [at - now for at in fn.replicas.values()]
            return max(min(starts), self.tick_s / 2) if starts else 3600.0
        backlog_wait = fn.backlog / (ready * fn.throughput)
        rho = rate / (ready * fn.throughput)
        if rho >= 0.99:  # the queue grows through the tick
            return service + backlog_wait + self.tick_s / 2
        waiting = service * rho ** (math.sqrt(2 * (ready + 1)) - 1) / (ready * (1 - rho))
        return service + waiting + backlog_wait


# --- the packing benchmark -------------------------------------------------------------------------


Packing = tuple[float, int, float, int, int]  # used / bound, replicas, seconds, GPUs left empty, unplaced


def packing(nodes: list[NodeInfo], fill: float, rng: random.Random) -> Packing:
    """Shared replicas (1-40 GB, any MB) asking ``fill`` of the GPU memory, placed in one pass, empty cluster."""
    snap = build_snapshot(Cluster.from_nodes(nodes))
    whole = [s for s in snap.cluster.slots if not s.mig_profile]
    budget = fill * sum(s.total_mb for s in whole)
    items: list[PlacementRequest] = []
    total = 0
    while total < budget:
        size = rng.randint(1024, 40 * 1024)
        function = f"p{len(items) // 3}"  # three replicas per function, to be spread
        items.append(PlacementRequest(replica_id=f"p{len(items)}", function=function,
                                      gpu=GpuRequest(count=1, memory_mb=size), cpu_millis=0, host_memory_mb=0))
        total += size
    started = time.perf_counter()
    decisions = place(snap, items)
    elapsed = time.perf_counter() - started
    after = apply_decisions(snap, decisions)
    used = [s for s in whole if after.used_mb[s.sid] > 0]
    requested = sum(after.used_mb[s.sid] for s in whole)
    empty = len(whole) - len(used)
    return sum(s.total_mb for s in used) / requested, len(items), elapsed, empty, sum(
        not isinstance(d, Binding) for d in decisions)


# --- the run ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 nodes, 1,000 functions, 10 simulated minutes")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    node_count, fn_count, horizon_s = (100, 1000, 600.0) if args.quick else (1000, 10_000, 3600.0)
    tick_s = 10.0
    rng = random.Random(args.seed)
    wall = time.perf_counter()
    nodes = make_nodes(node_count, rng)
    packs = [packing(nodes, fill, random.Random(args.seed)) for fill in (0.6, 0.85)]
    nodes = with_cached_bundles(nodes, fn_count, rng)
    functions = make_functions(fn_count, rng, horizon_s)
    sim = Sim(nodes, functions, tick_s, args.seed)
    gc.collect()
    gc.freeze()  # the cluster and the functions are long-lived: a control loop would do the same
    load_rng = random.Random(args.seed + 1)
    ticks = int(horizon_s / tick_s)
    losses = {ticks // 4, ticks // 2, 3 * ticks // 4}
    rebuilds = []
    first_pass = 0.0
    for tick in range(ticks):
        now = tick * tick_s
        rates = [rate_at(fn, now, load_rng) for fn in functions]
        if tick in losses:
            rebuilds.append(sim.lose_node(now))
        sim.reconcile(now, rates)
        if tick == 0:
            first_pass = sim.totals.passes.pop()
            sim.totals.passes_cpu.pop()
            first_placed = sim.totals.placed_per_pass.pop()
            sim.totals.autoscale.pop()
            sim.totals.placing.pop()
            sim.totals.rebalancing.pop()
            for fn in functions:  # the initial replicas count as warm
                fn.replicas = dict.fromkeys(fn.replicas, 0.0)
        sim.serve(now, rates)
    report(args, sim, nodes, functions, ticks, tick_s, first_pass, first_placed, rebuilds,
           packs, time.perf_counter() - wall)


def packing_rows(fill: int, pack: Packing) -> list[tuple[str, str, str]]:
    ratio, packed, seconds, empty, failed = pack
    return [
        (f"packing {fill}%: memory of the GPUs used / lower bound (the memory asked)",
         f"{ratio:.3f} (utilisation {100 / ratio:.1f}%)", "<= 1.10"),
        ("  its one placement pass", f"{packed:,} replicas in {seconds:.2f} s ({seconds / packed * 1e6:.0f} us each), "
         f"{empty:,} GPUs left empty, {failed:,} unplaced", ""),
    ]


def report(args: argparse.Namespace, sim: Sim, nodes: list[NodeInfo], functions: list[Fn], ticks: int,
           tick_s: float, first_pass: float, first_placed: int, rebuilds: list[float],
           packs: list[Packing], wall_s: float) -> None:
    t = sim.totals
    cluster = sim.snapshot.cluster
    gpus = sum(1 for d in (d for n in nodes for d in n.devices) if d.kind == "gpu" and not d.parent_uuid)
    hours = ticks * tick_s / 3600

    def ms(values: list[float]) -> str:
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return f"{statistics.median(ordered) * 1000:.1f} / {p95 * 1000:.1f} / {ordered[-1] * 1000:.1f}"

    exposed = sum(1 for f in sim.snapshot.crowded  # a node loss would take most of their replicas
                  if 2 * max(sim.snapshot.on_node[f].values()) > sum(sim.snapshot.on_node[f].values()))
    several = sum(1 for counts in sim.snapshot.on_node.values() if sum(counts.values()) >= 2)
    shared = [r for r in sim.snapshot.reservations.values() if r.memory_mb]
    shared_slots = {(r.node_id, u) for r in shared for u in r.gpu_uuids}
    live_ratio = sum(cluster.slots[cluster.slot_index[u]].total_mb for u in shared_slots) / max(
        sum(r.memory_mb for r in shared), 1)
    print(f"# Scheduler simulation{' (--quick)' if args.quick else ''}\n")
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{time.strftime('%a %b %d %H:%M:%S %Z %Y')}; nproc {os.cpu_count()}; load average at the end {load}; "
          f"Python {platform.python_version()}; seed {args.seed}; whole run {wall_s:.0f} s\n")
    print(f"Cluster: {sum(1 for n in nodes if n.node_id.startswith('g'))} GPU nodes ({gpus} GPUs, "
          f"{len(cluster.slots)} schedulable slots with MIG) + {sum(1 for n in nodes if n.node_id.startswith('c'))} "
          f"CPU nodes. {len(functions):,} functions, {ticks} ticks of {tick_s:.0f} s ({hours:.2f} h simulated), "
          f"3 GPU nodes lost.\n")
    rows = [
        ("reconcile pass: autoscale every function + place + apply + rebalance (median / p95 / max)",
         f"{ms(t.passes)} ms", "< 100 ms"),
        ("  the same passes in CPU time of this process (median / p95 / max)", f"{ms(t.passes_cpu)} ms", "< 100 ms"),
        ("  of which desired_replicas for all functions", f"{ms(t.autoscale)} ms", ""),
        ("  of which diff + place + apply (replicas asked per pass: mean / max)",
         f"{ms(t.placing)} ms ({statistics.mean(t.placed_per_pass):.0f} / {max(t.placed_per_pass)})", ""),
        ("  of which rebalance + apply its moves", f"{ms(t.rebalancing)} ms", ""),
        ("first pass: the initial replicas from nothing", f"{first_pass * 1000:.0f} ms for {first_placed:,} replicas",
         ""),
        ("node loss: rebuild cluster + snapshot (mean)", f"{statistics.mean(rebuilds) * 1000:.0f} ms", ""),
        *(row for fill, pack in zip((60, 85), packs, strict=True) for row in packing_rows(fill, pack)),
        ("live shared GPUs at the end: memory of GPUs used / memory reserved", f"{live_ratio:.3f}", ""),
        ("replicas moved per hour (preempted + node loss + rebalanced)",
         f"{(t.moved_preempted + t.moved_node_loss + t.moved_room + t.moved_spread) / hours:.0f} "
         f"({t.moved_preempted / hours:.0f} + {t.moved_node_loss / hours:.0f} + "
         f"{(t.moved_room + t.moved_spread) / hours:.0f})", ""),
        (f"  rebalancing moves per hour: room for a pending replica + spread (limit {MOVES.per_pass} a pass, "
         f"{MOVES.per_hour} an hour; make-before-break)",
         f"{t.moved_room / hours:.0f} + {t.moved_spread / hours:.0f}", ""),
        ("functions with two or more replicas, most of them on one node, at the end",
         f"{exposed:,} of {several:,}", ""),
        ("replicas bound / removed by scale-down / unschedulable (replica-passes)",
         f"{t.bound:,} / {t.removed:,} / {t.unschedulable:,}", ""),
        ("  unschedulable by kind", ", ".join(f"{k} {v:,}" for k, v in sorted(t.unschedulable_kinds.items())), ""),
        ("calls meeting their latency target", f"{100 * t.met / max(t.calls, 1):.2f}% of {t.calls:,.0f}", ""),
        ("  calls that found no ready replica (cold start or unschedulable); of them meeting the target",
         f"{100 * t.cold_calls / max(t.calls, 1):.2f}%; {100 * t.cold_met / max(t.cold_calls, 1):.1f}%", ""),
        ("  calls meeting the target among those that found a ready replica",
         f"{100 * (t.met - t.cold_met) / max(t.calls - t.cold_calls, 1):.2f}%", ""),
    ]
    print("| measure | value | target |\n|---|---|---|")
    for name, value, target in rows:
        print(f"| {name} | {value} | {target} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
