"""``place``: filter → score → bind for a list of replicas, over one immutable snapshot.

Interactive replicas are placed before batch ones (so batch work never takes the room an interactive
replica of the same pass needs), each in the order given; every decision sees the bindings made
before it. When an interactive replica fits nowhere, batch-class replicas may be preempted: the
binding names them in ``preempts``. The result is in the order of the requests, and the same inputs
always give the same decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ember_platform.scheduler.decision import Binding, Decision, Unschedulable
from ember_platform.scheduler.fit import Choice, choose_slots, fit
from ember_platform.scheduler.preempt import BatchWork, forget, preempt
from ember_platform.scheduler.request import GpuRequest, PlacementRequest
from ember_platform.scheduler.reservations import Usage, apply
from ember_platform.scheduler.snapshot import Cluster, Snapshot


def place(snapshot: Snapshot, requests: Sequence[PlacementRequest]) -> list[Decision]:
    """A decision for each request, in order: a ``Binding`` or an ``Unschedulable`` with its reason."""
    return _place(Usage(snapshot, snapshot.free_index().copy()), requests)


def place_and_apply(snapshot: Snapshot, requests: Sequence[PlacementRequest],
                    removed: Iterable[str] = ()) -> tuple[list[Decision], Snapshot]:
    """``place``, then ``apply_decisions`` with ``removed``, in one go: what a control loop runs every tick.

    The same result as the two calls, without building the placed replicas' accounting twice.
    """
    usage = Usage(snapshot, snapshot.free_index().copy())
    decisions = _place(usage, requests)
    for replica_id in removed:
        usage.remove(replica_id)
    return decisions, usage.freeze(snapshot.orphans)


def _place(usage: Usage, requests: Sequence[PlacementRequest]) -> list[Decision]:
    order = sorted(range(len(requests)), key=lambda i: (requests[i].priority != "interactive", i))
    decided: dict[int, Decision] = {}
    failed: dict[tuple[object, ...], str] = {}  # what did not fit cannot fit later in the pass: room only shrinks
    batch: BatchWork = {}  # gathered node by node when preemption looks, kept up to date through preemptions
    for i in order:
        item = requests[i]
        shape = (item.gpu, item.cpu_millis, item.host_memory_mb, item.priority)
        if shape in failed:
            decided[i] = Unschedulable(replica_id=item.replica_id, function=item.function, reason=failed[shape])
            continue
        decision = decided[i] = _place_one(usage, item, batch)
        if isinstance(decision, Unschedulable) and item.replica_id not in usage.reservations:
            failed[shape] = decision.reason
    return [decided[i] for i in range(len(requests))]


def apply_decisions(snapshot: Snapshot, decisions: Iterable[Decision], removed: Iterable[str] = ()) -> Snapshot:
    """The snapshot once the bindings run, their preempted replicas and ``removed`` ones stopped."""
    bindings = [d for d in decisions if isinstance(d, Binding)]
    gone = [*removed, *(v for b in bindings for v in b.preempts)]
    return apply(snapshot, [b.reservation() for b in bindings], gone)


def _place_one(usage: Usage, item: PlacementRequest, batch: BatchWork) -> Decision:
    if item.replica_id in usage.reservations:
        return Unschedulable(replica_id=item.replica_id, function=item.function,
                             reason=f"replica {item.replica_id!r} is already placed")
    choice = fit(usage, item)
    preempts: tuple[str, ...] = ()
    if choice is None and item.priority == "interactive":
        plan = preempt(usage, item, batch)
        if plan is not None:
            choice, preempts = plan.choice, plan.preempts
            forget(batch, usage, preempts)
    if choice is None:
        return Unschedulable(replica_id=item.replica_id, function=item.function, reason=_reason(usage.cluster, item))
    for replica_id in preempts:
        usage.remove(replica_id)
    binding = binding_for(usage.cluster, item, choice, preempts)
    usage.add(binding.reservation())
    return binding


def binding_for(cluster: Cluster, item: PlacementRequest, choice: Choice, preempts: tuple[str, ...]) -> Binding:
    slots = [cluster.slots[s] for s in choice.sids]
    numa = {s.numa_node for s in slots}
    return Binding(replica_id=item.replica_id, function=item.function, node_id=cluster.nodes[choice.nid].node_id,
                   gpu_uuids=tuple(s.uuid for s in slots), gpu_indices=tuple(s.gpu_index for s in slots),
                   memory_mb=item.gpu.memory_mb, cpu_millis=item.cpu_millis, host_memory_mb=item.host_memory_mb,
                   priority=item.priority, numa_node=numa.pop() if len(numa) == 1 else -1, preempts=preempts)


def _reason(cluster: Cluster, item: PlacementRequest) -> str:
    host = f"{item.cpu_millis} millicores and {item.host_memory_mb} MB of host memory"
    if item.gpu.cpu_only:
        return f"no node has {host} free"
    what = describe(item.gpu)
    if not _exists(cluster, item.gpu):
        return f"no node has {what}, even when idle"
    also = "" if item.priority == "batch" else ", and no batch-class replicas to preempt would make room"
    return f"every node with {what} is full (each replica also needs {host}){also}"


def _exists(cluster: Cluster, gpu: GpuRequest) -> bool:
    """Whether some node could take the request when idle."""
    groups = [g for tier in cluster.tiers(gpu.types, gpu.mig_profile) for g in tier if g[2] >= gpu.memory_mb]
    nvlink = gpu.topology == "nvlink"
    return any(choose_slots(cluster, [(0.0, s) for s in sids], gpu.count, nvlink) is not None
               for g in groups for sids in cluster.group_nodes[g].values())


def describe(gpu: GpuRequest) -> str:
    """``GpuRequest(count=2, types=("H100",), topology="nvlink")`` → "2 NVLink-joined GPUs of type H100"."""
    kind = " or ".join(gpu.types)
    of_type = f" of type {kind}" if kind else ""
    if gpu.mig_profile:
        return f"a MIG slice {gpu.mig_profile}{of_type}"
    amount = "a GPU" if gpu.count == 1 else f"{gpu.count} {'NVLink-joined ' if gpu.topology else ''}GPUs"
    memory = f" with {gpu.memory_mb} MB free{' each' if gpu.count > 1 else ''}" if gpu.memory_mb else ""
    return f"{amount}{of_type}{memory}"
