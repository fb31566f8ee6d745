"""Preloading: which nodes keep a zygote of which function version, within each node's host-memory budget.

A *zygote* holds a function version's imported code and its weights in host memory; a replica forked
from it costs a fork and a host-to-device copy instead of an interpreter, imports and a download. A
zygote serves only replicas on its own node, so each node is planned on its own: every candidate gets
a value there, and the node's budget is filled greedily by value per MB, most valuable first (what
does not make the cut is what a node evicts).

A zygote's value on a node is the function's *worth* times the node's *weight*:

- worth: ``log2(1 + demand)``, plus 1 for a function with ``min_replicas`` (its guarantee is restored
  after every crash or node loss). A guarantee counts as much as 1 call/s; the log keeps one busy
  function from crowding out every other: a zygote pays off per replica start, and starts grow with
  changes in traffic, not with its level.
- weight: ``RUNNING`` where the version runs now (every restart and scale-up there forks from it);
  ``LIKELY ** (rank + 1)`` on the nodes placement would pick for its next replicas, best first (each
  further replica is less likely to be needed); nothing elsewhere.

Two exceptions:

- a function with neither demand nor ``min_replicas`` is worth ``IDLE``: where it runs, and on the node
  placement would pick for its first replica (not on the next ones), kept while room is spare. Once it
  has scaled to zero, the first call after idleness is then a fork from that zygote, not a cold start;
  anything with demand or a guarantee comes first.
- an old version (not the deployment's current one) is weighted ``OLD_VERSION`` where it still runs and
  nothing elsewhere. Its replicas are being replaced, so the current version, preloaded before traffic
  moves to it, goes first on its likeliest node; the old zygote leaves with its last replica there.

Hysteresis: a zygote a node already holds counts ``HOLD`` times its value. Building one costs imports
and a load, so a plan does not swap it for one barely better, and plans do not churn from pass to pass.
Ties go to the lower ``ZygoteKey``: the same inputs always give the same plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import msgspec

from ember_platform.scheduler.decision import Binding
from ember_platform.scheduler.placement import place
from ember_platform.scheduler.request import PlacementRequest
from ember_platform.scheduler.snapshot import Snapshot

RUNNING = 1.0
LIKELY = 0.5  # the likely node of rank r weighs LIKELY ** (r + 1): 0.5, 0.25, 0.125, ...
OLD_VERSION = 0.3  # below the current version on its first likely node, above it on its second
IDLE = 0.01  # the worth of a function with neither demand nor min_replicas, where it runs
HOLD = 1.25  # a held zygote is replaced only by one worth more than this many times its value per MB
MAX_SPARES = 4  # children a zygote keeps forked ahead of their requests, at most (see ``spares``)


class ZygoteKey(NamedTuple):
    app: str
    service: str
    version: int


class PreloadCandidate(msgspec.Struct, frozen=True, kw_only=True):
    """One function version that could be preloaded, with what decides where.

    ``function`` is the scheduler's name for it (``"app.Service"``, as in ``Reservation.function``);
    ``size_mb`` is the host memory one zygote takes (measured by the agent when known, else estimated);
    ``running_nodes`` hold its replicas now; ``likely_nodes`` are where placement would put its next
    ones, best first (see ``likely_nodes``); ``demand`` is its recent calls per second; ``current`` is
    false for a version that a newer deployment replaces.
    """

    key: ZygoteKey
    function: str
    size_mb: int
    running_nodes: frozenset[str] = frozenset()
    likely_nodes: tuple[str, ...] = ()
    demand: float = 0.0
    min_replicas: int = 0
    current: bool = True

    def __post_init__(self) -> None:
        if self.size_mb < 0 or self.min_replicas < 0 or not self.demand >= 0:
            raise ValueError(f"{self!r}: size_mb, min_replicas and demand must be >= 0")


def likely_nodes(snapshot: Snapshot, request: PlacementRequest, count: int) -> tuple[str, ...]:
    """The nodes where ``place`` would put the next ``count`` replicas like ``request``, in order, each once
    (``next_nodes``: a node that would take several replicas appears once, at its first)."""
    return tuple(dict.fromkeys(next_nodes(snapshot, request, count)))


def next_nodes(snapshot: Snapshot, request: PlacementRequest, count: int) -> list[str]:
    """The node of each of the next ``count`` replicas like ``request``, in the order ``place`` would put them
    (``next_bindings``' nodes)."""
    return [binding.node_id for binding in next_bindings(snapshot, request, count)]


def next_bindings(snapshot: Snapshot, request: PlacementRequest, count: int) -> list[Binding]:
    """Where each of the next ``count`` replicas like ``request`` would go, node and GPUs, in the order ``place``
    would put them.

    A dry run of the real placement policy: one ``place`` call of ``count`` copies of the request
    (under replica ids that the snapshot does not hold) sees each binding before the next decision, as
    placing them one by one with ``apply_decisions`` would. It stops at the first replica that fits
    nowhere; nothing is changed.
    """
    if count <= 0:
        return []
    ids = _fresh_ids(request.replica_id or request.function, count, snapshot.reservations)
    decisions = place(snapshot, [msgspec.structs.replace(request, replica_id=i) for i in ids])
    bindings: list[Binding] = []
    for decision in decisions:
        if not isinstance(decision, Binding):
            break
        bindings.append(decision)
    return bindings


def spares(next_starts: Sequence[str], node_id: str) -> int:
    """How many children a zygote on ``node_id`` keeps forked ahead of their requests: one per start expected
    there (``next_starts``: the nodes of the replicas the function may add next, as ``next_nodes`` gives them),
    so that a burst of scale-ups is a hand-over each; one at least, for a restart."""
    return min(max(sum(node == node_id for node in next_starts), 1), MAX_SPARES)


def starts_ahead(demand: float, min_replicas: int, max_replicas: int, planned: int) -> int:
    """How many starts of a function to keep spares for: up to its ``max_replicas`` (at most ``MAX_SPARES``), or
    one for a function with neither demand nor ``min_replicas`` (its next start is one scale from zero)."""
    if demand <= 0 and min_replicas <= 0:
        return 1
    return min(max(max_replicas - planned, 1), MAX_SPARES)


def _fresh_ids(base: str, count: int, taken: Mapping[str, object]) -> list[str]:
    prefix = f"{base}~preload"
    while any(f"{prefix}-{i}" in taken for i in range(count)):
        prefix += "~"
    return [f"{prefix}-{i}" for i in range(count)]


def preload_value(candidate: PreloadCandidate, node_id: str) -> float:
    """The value of ``candidate``'s zygote on ``node_id``, before hysteresis; 0: it is not kept there."""
    demand = math.log2(1.0 + candidate.demand)
    worth = demand + 1.0 if candidate.min_replicas > 0 else demand
    if node_id in candidate.running_nodes:
        return (worth or IDLE) * (RUNNING if candidate.current else OLD_VERSION)
    if not (candidate.current and node_id in candidate.likely_nodes):
        return 0.0
    rank = candidate.likely_nodes.index(node_id)
    if not worth:  # idle: where its next start (a scale from zero) would be, while room is spare
        return IDLE * LIKELY if rank == 0 else 0.0
    return worth * LIKELY ** (rank + 1)


def plan_preload(candidates: Sequence[PreloadCandidate], budgets_mb: Mapping[str, int],
                 held: Mapping[str, frozenset[ZygoteKey]]) -> dict[str, frozenset[ZygoteKey]]:
    """The zygotes each node of ``budgets_mb`` should hold, within its budget, given those it ``held``.

    Every node of ``budgets_mb`` gets an entry (maybe empty); other nodes get none. A held zygote that
    is no longer a candidate, or is worth nothing on its node, is simply absent: the node evicts it.
    Two candidates with one key are a caller's error (``ValueError``).
    """
    _check_unique(candidates)
    near: dict[str, list[PreloadCandidate]] = {node: [] for node in budgets_mb}
    for candidate in candidates:
        for node in {*candidate.running_nodes, *candidate.likely_nodes}:
            if node in near:
                near[node].append(candidate)
    return {node: _fill(node, near[node], budgets_mb[node], held.get(node, frozenset()))
            for node in sorted(budgets_mb)}


def _check_unique(candidates: Iterable[PreloadCandidate]) -> None:
    seen: set[ZygoteKey] = set()
    for candidate in candidates:
        if candidate.key in seen:
            raise ValueError(f"two preload candidates for {candidate.key}")
        seen.add(candidate.key)


def _fill(node: str, candidates: list[PreloadCandidate], budget_mb: int,
          held: frozenset[ZygoteKey]) -> frozenset[ZygoteKey]:
    """Greedy by value per MB; a zygote that does not fit in what is left is skipped, smaller ones still go."""
    ranked = sorted((-density, c.key, c.size_mb) for c in candidates if (density := _density(c, node, c.key in held)))
    chosen: list[ZygoteKey] = []
    room = budget_mb
    for _, key, size_mb in ranked:
        if size_mb <= room:
            chosen.append(key)
            room -= size_mb
    return frozenset(chosen)


def _density(candidate: PreloadCandidate, node: str, held: bool) -> float:
    value = preload_value(candidate, node) * (HOLD if held else 1.0)
    return value / max(candidate.size_mb, 1)
