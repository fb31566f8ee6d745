"""``ember status [APP[.FN]]``: nodes, their GPUs and replicas, and each service against its bounds."""

from __future__ import annotations

import argparse

import msgspec

from ember._client import default_transport
from ember.cli.output import split_target, table
from ember.wire import DeviceView, NodeView, ServiceStatus, StatusView


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="show nodes, GPU memory, replicas and each function's scaling state")
    p.add_argument("target", nargs="?", metavar="APP[.FUNCTION]", help="only this app or function")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    params = _filter(args.target)
    view = msgspec.json.decode(default_transport().request("GET", "/v1/status", params=params).content,
                               type=StatusView)
    shown = {(s.app, s.service) for s in view.services} if params else None
    for line in view.insecure:
        print(f"INSECURE: {line}")
    print(nodes_table(view.nodes, shown) if view.nodes else "no live nodes; is a node agent running?")
    if view.nodes:
        print()
        print(isolation_table(view.nodes))
    zygotes = zygotes_table(view.nodes, shown)
    if zygotes:
        print()
        print(zygotes)
    warm = warm_table(view.nodes, {app for app, _ in shown} if shown is not None else None)
    if warm:
        print()
        print(warm)
    if shown is not None and any(r.start for n in view.nodes for r in n.replicas):
        print()
        print(starts_table(view.nodes, shown))
    print()
    print(services_table(view.services) if view.services else "no apps deployed")
    return 0


def _filter(target: str | None) -> dict[str, str]:
    if not target:
        return {}
    if "." not in target:
        return {"app": target}
    app, fn = split_target(target)
    return {"app": app, "service": fn.split(".")[0]}  # a class model's method is served by its class


def nodes_table(nodes: list[NodeView], shown: set[tuple[str, str]] | None = None) -> str:
    """One row per device: memory used (by anything) / reserved (by assigned replicas) / total, and replicas.

    With ``shown``, only those services' replicas are listed (memory is always the whole device's).
    """
    rows = []
    for node in nodes:
        states = {r.replica_id: r.state for r in node.replicas
                  if shown is None or (r.app, r.service) in shown}
        for device in node.devices:
            replicas = [f"{rid} ({states[rid]})" for rid in device.replicas if rid in states]
            rows.append((node.node_id, _device_name(device), _memory(device), ", ".join(replicas) or "-"))
        gpuless = [r for r in node.replicas if r.replica_id in states and not r.gpu_uuids
                   and not any(r.replica_id in d.replicas for d in node.devices)]
        if gpuless:
            rows.append((node.node_id, "-", "-", ", ".join(f"{r.replica_id} ({r.state})" for r in gpuless)))
    return table(["NODE", "DEVICE", "MEMORY USED/RESERVED/TOTAL", "REPLICAS"], rows)


def isolation_table(nodes: list[NodeView]) -> str:
    """One row per node: how it holds replicas (a sandbox, a network of their own) and what they lack there."""
    rows = [(node.node_id, node.sandbox or "unknown", "; ".join(node.isolation_notes) or "-") for node in nodes]
    return table(["NODE", "SANDBOX", "ISOLATION NOTES"], rows)


def zygotes_table(nodes: list[NodeView], shown: set[tuple[str, str]] | None = None) -> str:
    """One row per preloaded zygote (empty when no node holds one)."""
    rows = [(node.node_id, f"{z.app}.{z.service} v{z.version}", z.state, _gpus_of(node, z.gpus), f"{z.rss_mb} MB",
             f"{z.build_s:.1f}s", str(z.spares), str(z.forks), str(z.failures), z.message[:60] or "-")
            for node in nodes for z in node.zygotes if shown is None or (z.app, z.service) in shown]
    return table(["NODE", "ZYGOTE", "STATE", "GPUS", "MEMORY", "BUILT IN", "SPARES", "FORKS", "FAILURES",
                  "LAST FAILURE"], rows) if rows else ""


def _gpus_of(node: NodeView, uuids: list[str]) -> str:
    """The GPUs a zygote's sandbox holds, by their index on the node (``-``: none, its node binds no GPU's)."""
    index = {d.uuid: f"gpu{d.index}" for d in node.devices if d.uuid}
    return ",".join(index.get(uuid, uuid) for uuid in uuids) or "-"


def warm_table(nodes: list[NodeView], apps: set[str] | None = None) -> str:
    """One row per app a node holds a warm start for (empty when none): its next fresh start may take it."""
    rows = [(node.node_id, app, state) for node in nodes for app, state in sorted(node.warm_starts.items())
            if apps is None or app in apps]
    return table(["NODE", "WARM START OF", "STATE"], rows) if rows else ""


def starts_table(nodes: list[NodeView], shown: set[tuple[str, str]]) -> str:
    """One row per replica of the shown services: the kind of its start and where the time went (ms)."""
    rows = []
    for node in nodes:
        for r in node.replicas:
            p = r.start
            if p is None or (r.app, r.service) not in shown:
                continue
            ms = [f"{v * 1000:.0f}" for v in (p.fetch_s, p.interpreter_s, p.imports_s, p.snap_setup_s, p.fork_s,
                                              p.setup_s, p.ready_s)]
            first = "-" if p.first_call_s is None else f"{p.first_call_s * 1000:.0f}"
            rows.append((r.replica_id, p.kind, *ms, first))
    return table(["REPLICA", "START", "FETCH MS", "INTERPRETER", "IMPORTS", "SNAP SETUP", "FORK", "SETUP",
                  "READY", "FIRST CALL"], rows)


def _version(s: ServiceStatus) -> str:
    """``v3``, or with a rollout or canary under way who takes the calls: ``v3 (v2 80%, v3 20%)``."""
    shares = [t for t in s.traffic if t.percent]
    if not shares or [(t.version, t.percent) for t in shares] == [(s.version, 100)]:
        return f"v{s.version}"
    return f"v{s.version} (" + ", ".join(f"v{t.version} {t.percent}%" for t in shares) + ")"


def services_table(services: list[ServiceStatus]) -> str:
    """One row per service: ready/desired replicas, bounds, queued calls and why it is short, if it is."""
    rows = [(f"{s.app}.{s.service}", _version(s), f"{s.ready}/{s.desired}",
             f"{s.min_replicas}..{s.max_replicas}" + (" (scaled)" if s.scaled else ""),
             s.queue_depth, s.pending, _note(s)) for s in services]
    return table(["FUNCTION", "VERSION", "READY/DESIRED", "MIN..MAX", "QUEUE", "PENDING", "NOTE"], rows)


def _device_name(device: DeviceView) -> str:
    if device.kind == "cpu":
        return f"cpu {device.name}"
    name = f"gpu{device.index} {device.name}" + (" (MIG)" if device.mig_enabled else "")
    return name + (f" OUT OF SERVICE ({device.fault})" if device.fault else "")


def _memory(device: DeviceView) -> str:
    if device.kind == "cpu" or not device.memory_total_mb:
        return "-"
    used = "?" if device.memory_free_mb is None else _gib(device.memory_total_mb - device.memory_free_mb)
    return f"{used}/{_gib(device.memory_reserved_mb)}/{_gib(device.memory_total_mb)} GiB"


def _gib(mb: int) -> str:
    return f"{mb / 1024:.1f}"


def _note(s: ServiceStatus) -> str:
    notes = [f"failed: {s.failure}"] if s.failure else []
    notes += [f"unschedulable: {s.unschedulable}"] if s.unschedulable else []
    notes += [f"held back: {s.quota}"] if s.quota else []
    notes += [f"replaced {s.replaced}"] if s.replaced else []
    notes += [f"{n} {what}" for n, what in ((s.starting, "starting"), (s.crashed, "crashed")) if n]
    return "; ".join(notes) or "-"
