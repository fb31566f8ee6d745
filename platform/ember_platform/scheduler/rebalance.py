"""``rebalance``: a few replica moves that leave the cluster better placed, each one make-before-break.

Two reasons to move a replica that runs well where it is:

- room: a replica that fits nowhere (*pending*) would fit on a node once some replicas there ran
  elsewhere. The nodes looked at are those where the least memory stands in the way (walking each GPU
  group from the slot closest to having room); on each, the replicas to move are chosen as preemption
  chooses its victims (``plan_on_node``: the fewest, smallest first), and the node needing the fewest
  moves wins, provided every replica that moves fits somewhere else now;
- spread: a node runs most of a function's replicas (two or more), so that losing it would lose most of
  them, while a node with room runs fewer than one less (after a node loss, or replicas placed while
  the cluster was smaller or fuller).

A ``Move`` is the replacement's ``Binding`` and the replica it replaces. The control loop starts the new
replica and stops the old one only once the new one is ready, so a function never has fewer ready
replicas than before: ``min_replicas`` holds through a move. The new homes are free now, not only once
the old replicas stop, and the room made for a pending replica is held while later moves are planned.
Only replicas that ``movable`` allows are moved: the caller rules out those still starting, already
moving, or of an old version. At most ``budget`` moves per call; ``MoveBudget`` limits them over time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

import msgspec

from ember_platform.scheduler.decision import Binding
from ember_platform.scheduler.fit import fit, need_mb
from ember_platform.scheduler.index import FreeIndex
from ember_platform.scheduler.placement import binding_for
from ember_platform.scheduler.preempt import Plan, could_fit, gather, groups_of, plan_on_node
from ember_platform.scheduler.request import PlacementRequest
from ember_platform.scheduler.reservations import Usage
from ember_platform.scheduler.snapshot import Reservation, Snapshot

_PENDING = 8  # pending replicas (of distinct shapes) looked at per call
_NODES = 8  # nodes planned per pending replica
_WALK = 512  # slots walked per GPU group to find those nodes
_SPREAD_TRIES = 16  # crowded functions tried per call
_ROOM_SEEN = 64  # slots with room looked at to find a less crowded node
_HOUR_S = 3600.0

MoveReason = Literal["room", "spread"]


class Move(msgspec.Struct, frozen=True, kw_only=True):
    """Start ``binding``'s replica; stop ``replica_id`` once that one is ready."""

    replica_id: str
    binding: Binding
    reason: MoveReason
    room_for: str = ""  # "room": the function of the pending replica the room is made for


class MoveBudget(msgspec.Struct, frozen=True, kw_only=True):
    """At most ``per_pass`` moves started at a time, and ``per_hour`` in any hour."""

    per_pass: int = 2
    per_hour: int = 60
    started: tuple[float, ...] = ()  # when the moves of the last hour started

    def available(self, now: float) -> int:
        recent = sum(1 for t in self.started if now - t < _HOUR_S)
        return max(0, min(self.per_pass, self.per_hour - recent))

    def spend(self, now: float, count: int) -> MoveBudget:
        kept = tuple(t for t in self.started if now - t < _HOUR_S)
        return msgspec.structs.replace(self, started=kept + (now,) * count)


def rebalance(snapshot: Snapshot, pending: Sequence[PlacementRequest], templates: Mapping[str, PlacementRequest],
              movable: Callable[[Reservation], bool], new_id: Callable[[str], str], budget: int) -> list[Move]:
    """Up to ``budget`` moves: room for ``pending`` replicas first (interactive ones first), then spread.

    ``templates`` gives, per function, the request its replicas are placed with (its ``replica_id`` is
    not used); replicas of other functions never move. ``new_id(old)`` names the replacement of ``old``
    (a name no replica has). The same inputs always give the same moves.
    """
    pending = [p for p in pending if p.replica_id not in snapshot.reservations]
    if budget <= 0 or not (pending or snapshot.crowded):
        return []
    usage = Usage(snapshot, snapshot.free_index().copy())
    moving: set[str] = set()  # replicas this call moves, and their replacements

    def may_move(r: Reservation) -> bool:
        return r.function in templates and r.replica_id not in moving and movable(r)

    moves: list[Move] = []
    for item in _distinct(sorted(pending, key=lambda p: (p.priority != "interactive", p.gpu.count))):
        if len(moves) >= budget:
            break
        made = _make_room(usage, item, templates, may_move, new_id, budget - len(moves))
        moving.update(x for m in made for x in (m.replica_id, m.binding.replica_id))
        moves += made
    if len(moves) < budget:
        moves += _spread(usage, templates, may_move, new_id, budget - len(moves))
    return moves


def _distinct(pending: Iterable[PlacementRequest]) -> list[PlacementRequest]:
    """The first pending replica of each shape (what helps one helps its twins), at most ``_PENDING``."""
    out: dict[tuple[object, ...], PlacementRequest] = {}
    for item in pending:
        if not item.gpu.cpu_only:
            out.setdefault((item.gpu, item.cpu_millis, item.host_memory_mb, item.priority), item)
    return list(out.values())[:_PENDING]


# --- room for a pending replica --------------------------------------------------------------------


def _make_room(usage: Usage, item: PlacementRequest, templates: Mapping[str, PlacementRequest],
               may_move: Callable[[Reservation], bool], new_id: Callable[[str], str], budget: int) -> list[Move]:
    """The fewest moves (at most ``budget``) after which ``item`` fits, or none."""
    groups = groups_of(usage, item)
    nodes = _closest_nodes(usage, usage.free_index(), item, budget)
    plans: list[Plan] = []
    index, usage.index = usage.index, None  # plan_on_node undoes every change: the index stays valid
    try:
        for nid in nodes:
            replicas = [r for r in usage.by_node.get(nid, {}).values()
                        if r.function != item.function and _shares(r) and may_move(r)]  # never for its own twin
            if replicas and could_fit(usage, item, nid, gather(usage, replicas), groups):
                plan = plan_on_node(usage, item, nid, replicas)
                if plan is not None and plan.victims <= budget:
                    plans.append(plan)
    finally:
        usage.index = index
    for plan in sorted(plans):
        moves = _rehome(usage, item, plan, templates, new_id)
        if moves is not None:
            return moves
    return []


def _shares(r: Reservation) -> bool:
    """Whether ``r`` holds no GPU whole (only those can move into a GPU in use)."""
    return bool(r.memory_mb) or not r.gpu_uuids


def _closest_nodes(usage: Usage, index: FreeIndex, item: PlacementRequest, budget: int) -> list[int]:
    """Up to ``_NODES`` nodes where the least memory stands between ``item`` and a fit: per group, walking
    down from the slot closest to having room, the first nodes to gather ``count`` slots. A slot without
    room takes at least one move, so a node whose ``count`` best slots lack room on more than ``budget``
    is passed over."""
    slots = usage.cluster.slots
    count = item.gpu.count
    found: list[int] = []
    for tier in usage.cluster.tiers(item.gpu.types, item.gpu.mig_profile):
        for group in tier:
            need = need_mb(item, group[2])
            roomy: dict[int, int] = {}  # slots with room already count towards a multi-GPU fit
            for _, sid in index.slots_from(group, need) if count > 1 else ():
                roomy[slots[sid].nid] = roomy.get(slots[sid].nid, 0) + 1
            short: dict[int, int] = {}
            for seen, (_, sid) in enumerate(index.slots_below(group, need)):
                nid = slots[sid].nid
                short[nid] = short.get(nid, 0) + 1
                if short[nid] + roomy.get(nid, 0) == count and short[nid] <= budget and nid not in found:
                    found.append(nid)
                if len(found) >= _NODES or seen >= _WALK:
                    break
            if len(found) >= _NODES:
                return found
    return found


def _rehome(usage: Usage, item: PlacementRequest, plan: Plan, templates: Mapping[str, PlacementRequest],
            new_id: Callable[[str], str]) -> list[Move] | None:
    """Moves for ``plan``'s victims, each to a place free now; ``None`` (and ``usage`` as it was) if one has none.

    A victim goes only into a GPU that is in use already: making room never takes an empty GPU, which
    another large replica may need as much (so whole-GPU and multi-GPU replicas never move for room).
    The pending replica's room is held by a stand-in reservation (over the victims, which stay held too: they
    run until their replacements are ready), so that no victim, and no later move of this call, is put there.
    """
    held = binding_for(usage.cluster, item, plan.choice, ()).reservation()
    usage.add(held)
    moves: list[Move] = []
    for victim_id in plan.preempts:
        victim = usage.reservations[victim_id]
        request = msgspec.structs.replace(templates[victim.function], replica_id=new_id(victim_id))
        choice = fit(usage, request)
        if choice is None or any(usage.used_mb[sid] == 0 for sid in choice.sids):
            for move in moves:
                usage.remove(move.binding.replica_id)
            usage.remove(held.replica_id)
            return None
        binding = binding_for(usage.cluster, request, choice, ())
        usage.add(binding.reservation())
        moves.append(Move(replica_id=victim_id, binding=binding, reason="room", room_for=item.function))
    return moves  # the victims stay in ``usage``: they run until their replacements are ready


# --- spread ----------------------------------------------------------------------------------------


def _spread(usage: Usage, templates: Mapping[str, PlacementRequest], may_move: Callable[[Reservation], bool],
            new_id: Callable[[str], str], budget: int) -> list[Move]:
    """At most one move per crowded function, from its most crowded node to where ``fit`` puts it, if that
    node then runs fewer of its replicas than the one it leaves."""
    moves: list[Move] = []
    tries = 0
    for function in sorted(usage.crowded):
        if len(moves) >= budget or tries >= _SPREAD_TRIES:
            break
        template = templates.get(function)
        counts = usage.on_node.get(function, {})
        nid = min(counts, key=lambda n: (-counts[n], n))  # the most crowded node
        crowd = counts[nid]
        if template is None or 2 * crowd <= sum(counts.values()):  # losing that node would not lose most of them
            continue
        old = next((r for _, r in sorted(usage.by_node[nid].items()) if r.function == function and may_move(r)), None)
        if old is None or not _room_elsewhere(usage, function, template, crowd):
            continue
        tries += 1
        request = msgspec.structs.replace(template, replica_id=new_id(old.replica_id))
        choice = fit(usage, request)  # with ``old`` still held: it runs until its replacement is ready
        if choice is None or usage.replicas_on_node(function, choice.nid) >= crowd - 1:
            continue
        binding = binding_for(usage.cluster, request, choice, ())
        usage.add(binding.reservation())
        moves.append(Move(replica_id=old.replica_id, binding=binding, reason="spread"))
    return moves


def _room_elsewhere(usage: Usage, function: str, template: PlacementRequest, crowd: int) -> bool:
    """Whether some slot with room for ``template`` is on a node with fewer than ``crowd - 1`` replicas of
    ``function`` (a cheap check before trying ``fit``; multi-GPU and CPU-only replicas are always tried)."""
    if template.gpu.count != 1:
        return True
    index = usage.free_index()
    slots = usage.cluster.slots
    for tier in usage.cluster.tiers(template.gpu.types, template.gpu.mig_profile):
        for group in tier:
            for seen, (_, sid) in enumerate(index.slots_from(group, need_mb(template, group[2]))):
                if usage.replicas_on_node(function, slots[sid].nid) < crowd - 1:
                    return True
                if seen >= _ROOM_SEEN:
                    break
    return False
