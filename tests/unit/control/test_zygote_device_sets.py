"""On a node whose sandboxes bind their GPUs' device nodes, a GPU replica forks only from a zygote whose sandbox
holds its GPUs, so the preloader tells each such zygote which GPUs (``ZygoteAssignment.gpus``): those of a replica of
its version placed there and still starting (a new version's first replicas wait for their zygote), else those the
next replica placed there would get, else those of one running there (its restart). A zygote runs its app's code: it
never holds a GPU another app's replica is given. Its spares are the starts expected on its own GPUs."""

from __future__ import annotations

import msgspec
from support.builders import deployment, service_spec, slot
from support.placement import H100X2, node

from ember.wire import Deployment, NodeInfo, SlotAssignment, ZygoteAssignment
from ember.wire.specs import GpuRequest
from ember_platform.control.plan import cluster_snapshot
from ember_platform.control.preloader import Preloader, device_sets
from ember_platform.scheduler.preload import ZygoteKey

KEY = ZygoteKey("a", "s", 1)
SHARE = GpuRequest(count=1, memory_mb=20_000)  # 20 GB of one GPU: replicas share a GPU by memory


def _zygotes(plan: dict[str, list[SlotAssignment]], *, reported: frozenset[str] = frozenset(), demand: float = 0.0,
             dep: Deployment | None = None) -> list[ZygoteAssignment]:
    """The zygotes of node n1 (two whole H100s, sandboxed) for a one-GPU snap service of app "a"."""
    n1 = msgspec.structs.replace(node("n1", H100X2), gpu_forks=False, gpu_zygotes=True)
    dep = dep or deployment(service_spec("s", snap=True, min_replicas=1, max_replicas=4, gpu_count=1))
    nodes, deployments = {"n1": n1}, {"a": dep}
    zygotes = Preloader(demand=lambda app, svc: demand).zygotes(
        plan, nodes, deployments, lambda: cluster_snapshot(plan, nodes, deployments), now=0.0, reported=reported)
    return zygotes.get("n1", [])


def test_a_zygote_holds_the_gpus_of_its_next_replica_there() -> None:
    (zygote,) = _zygotes({})
    assert (zygote.version, zygote.gpus, zygote.spares) == (1, ["GPU-n1-0"], 1)
    (zygote,) = _zygotes({"n1": [slot("a-1", "GPU-n1-0")]}, reported=frozenset({"a-1"}))
    assert zygote.gpus == ["GPU-n1-1"]  # the first GPU runs a replica that reported: the next goes on the second


def test_a_replica_still_starting_gets_its_zygote_first() -> None:
    (zygote,) = _zygotes({"n1": [slot("a-1", "GPU-n1-0")]})  # placed, not reported yet: it waits for its zygote
    assert zygote.gpus == ["GPU-n1-0"]


def test_a_zygote_where_every_gpu_runs_a_replica_holds_one_of_theirs_for_a_restart() -> None:
    plan = {"n1": [slot("a-1", "GPU-n1-0"), slot("a-2", "GPU-n1-1", index=1)]}
    (zygote,) = _zygotes(plan, reported=frozenset({"a-1", "a-2"}))
    assert zygote.gpus == ["GPU-n1-0"]


def test_spares_count_only_the_starts_on_the_zygotes_own_gpus() -> None:
    # busy: the next starts go to both GPUs of n1, one each: only one would fork from the zygote of the first
    (zygote,) = _zygotes({}, demand=50.0)
    assert (zygote.gpus, zygote.spares) == (["GPU-n1-0"], 1)
    # replicas sharing a GPU by memory: placement spreads the next four over both GPUs, two on the zygote's
    shared = deployment(service_spec("s", snap=True, min_replicas=1, max_replicas=4, gpu_count=1, gpu=SHARE))
    (zygote,) = _zygotes({}, demand=50.0, dep=shared)
    assert (zygote.gpus, zygote.spares) == (["GPU-n1-0"], 2)


def test_no_zygote_holds_a_gpu_that_another_apps_replica_is_given() -> None:
    theirs = SlotAssignment(replica_id="b-1", app="b", service="t", version=1, index=0, gpu_uuids=["GPU-n1-0"],
                            memory_mb=20_000)
    binding_gpus = ("GPU-n1-0",)  # a replica sharing that GPU by memory could go there next
    plan = {"n1": [theirs]}

    class Next:  # what the dry run of placement gives: the next replica on n1, on the shared GPU
        node_id, gpu_uuids = "n1", binding_gpus

    assert device_sets(KEY, [Next()], plan, ["n1"]) == {"n1": ()}  # type: ignore[list-item]
    assert device_sets(KEY, [Next()], {}, ["n1"]) == {"n1": binding_gpus}  # type: ignore[list-item]
    shared = deployment(service_spec("s", snap=True, min_replicas=1, gpu_count=1, gpu=SHARE))
    assert _zygotes(plan, dep=shared) == []  # n1's only candidate GPU is shared with app b: no zygote there


def test_a_zygote_stays_on_its_gpus_while_a_next_start_would_use_them() -> None:
    """Replicas that share GPUs by memory are spread over them: a zygote that followed the very next start would
    move (a new build) at each one. It stays while one of the next starts there would use its GPUs; a zygote of
    whole-GPU replicas moves once its GPU is taken."""
    n1 = msgspec.structs.replace(node("n1", H100X2), gpu_forks=False, gpu_zygotes=True)

    def plans(dep: Deployment) -> tuple[list[str], list[str]]:
        preloader = Preloader(demand=lambda app, svc: 0.0)
        nodes, deployments = {"n1": n1}, {"a": dep}
        before = preloader.zygotes({}, nodes, deployments, lambda: cluster_snapshot({}, nodes, deployments), now=0.0)
        plan = {"n1": [slot("a-1", *before["n1"][0].gpus)]}  # its first replica, there, now running
        after = preloader.zygotes(plan, nodes, deployments, lambda: cluster_snapshot(plan, nodes, deployments),
                                  now=10.0, reported=frozenset({"a-1"}))
        return before["n1"][0].gpus, after["n1"][0].gpus

    shared = deployment(service_spec("s", snap=True, min_replicas=1, max_replicas=4, gpu_count=1, gpu=SHARE))
    assert plans(shared) == (["GPU-n1-0"], ["GPU-n1-0"])  # the next starts: GPU-1, GPU-0, GPU-1: it stays
    whole = deployment(service_spec("s", snap=True, min_replicas=1, max_replicas=4, gpu_count=1))
    assert plans(whole) == (["GPU-n1-0"], ["GPU-n1-1"])  # GPU-0 is taken whole: the next start is on GPU-1


def test_a_replica_on_a_gpu_out_of_service_gives_its_zygote_no_gpus() -> None:
    """Both GPUs run a replica, one of them on a GPU that failed (being replaced): the zygote is for the restart of
    the other, never on the failed GPU."""
    plan = {"n1": [slot("a-1", "GPU-n1-0"), slot("a-2", "GPU-n1-1", index=1)]}
    assert device_sets(KEY, [], plan, ["n1"], frozenset({"a-1", "a-2"})) == {"n1": ("GPU-n1-0",)}
    failed = frozenset({("n1", "GPU-n1-0")})
    assert device_sets(KEY, [], plan, ["n1"], frozenset({"a-1", "a-2"}), faulty=failed) == {"n1": ("GPU-n1-1",)}
    alone = {"n1": [slot("a-1", "GPU-n1-0")]}
    assert device_sets(KEY, [], alone, ["n1"], frozenset({"a-1"}), faulty=failed) == {"n1": ()}  # no zygote there


def test_at_its_maximum_a_zygote_holds_a_running_replicas_gpu_and_its_replacements_once_that_fails() -> None:
    """At its maximum a service's next start is a restart: its zygote holds the GPU of a replica running there, not
    one placement would give a replica it may not add. Once that GPU fails, its replacement's."""
    n1 = msgspec.structs.replace(node("n1", H100X2), gpu_forks=False, gpu_zygotes=True)
    failed = msgspec.structs.replace(n1, devices=[msgspec.structs.replace(d, fault="Xid 79 at 12:00:00 UTC")
                                                  if d.uuid == "GPU-n1-0" else d for d in n1.devices])
    dep = deployment(service_spec("s", snap=True, min_replicas=1, max_replicas=1, gpu_count=1))
    plan = {"n1": [slot("a-1", "GPU-n1-0")]}

    def gpus(info: NodeInfo) -> list[list[str]]:
        nodes, deployments = {"n1": info}, {"a": dep}
        zygotes = Preloader(demand=lambda app, svc: 0.0).zygotes(
            plan, nodes, deployments, lambda: cluster_snapshot(plan, nodes, deployments), now=0.0,
            reported=frozenset({"a-1"}))
        return [z.gpus for z in zygotes["n1"]]

    assert gpus(n1) == [["GPU-n1-0"]]  # healthy and at its maximum: for its restart, on its GPU
    assert gpus(failed) == [["GPU-n1-1"]]  # its GPU failed: for its replacement, on the healthy GPU
