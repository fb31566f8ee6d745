"""Rebalancing on declared virtual inventories: room for what fits nowhere, spread, limits, make-before-break."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.placement import A10G, node, snap

from ember_platform.scheduler import (
    Binding,
    GpuRequest,
    Move,
    MoveBudget,
    PlacementRequest,
    Reservation,
    Snapshot,
    Unschedulable,
    apply_decisions,
    build_snapshot,
    parse_gpu,
    place,
    rebalance,
)

A10GX2 = '[[gpu]]\nmodel = "A10G-24GB"\ncount = 2\n'
H100X4 = 'nvlink = [[0, 1, 2, 3]]\n[[gpu]]\nmodel = "H100-80GB"\ncount = 4\n'


def held(replica_id: str, node_id: str, uuid: str, memory_mb: int = 0, *, function: str | None = None) -> Reservation:
    return Reservation(replica_id=replica_id, function=function or replica_id, node_id=node_id, gpu_uuids=(uuid,),
                       memory_mb=memory_mb)


def req(replica_id: str, gpu: Any, *, function: str | None = None, **fields: Any) -> PlacementRequest:
    """``gpu`` as the decorator takes it, or an int: a share of that many MB of one GPU."""
    request = GpuRequest(count=1, memory_mb=gpu) if isinstance(gpu, int) else parse_gpu(gpu)
    return PlacementRequest(replica_id=replica_id, function=function or replica_id, gpu=request,
                            cpu_millis=0, host_memory_mb=0, **fields)


def templates(s: Snapshot, extra: Iterable[PlacementRequest] = ()) -> dict[str, PlacementRequest]:
    """Each function's request, read back from its reservations (shared GPU by memory, else a whole GPU)."""
    out = {r.function: req("", r.memory_mb or "A10G", function=r.function)
           for r in s.reservations.values()}
    return out | {t.function: t for t in extra}


def moves_of(s: Snapshot, pending: list[PlacementRequest] = (), *,  # type: ignore[assignment]
             movable: Callable[[Reservation], bool] = lambda r: True, budget: int = 4,
             extra: Iterable[PlacementRequest] = ()) -> list[Move]:
    return rebalance(s, pending, templates(s, extra), movable, lambda old: f"{old}'", budget)


def after_moves(s: Snapshot, moves: list[Move]) -> tuple[Snapshot, Snapshot]:
    """The snapshot while the replacements start (both ends held), and once the replaced replicas stopped."""
    during = apply_decisions(s, [m.binding for m in moves])
    return during, apply_decisions(during, [], removed=[m.replica_id for m in moves])


def assert_fits(s: Snapshot) -> None:
    assert all(s.free_mb(slot.sid) >= 0 for slot in s.cluster.slots)


# --- room for a replica that fits nowhere ---------------------------------------------------------


def _fragmented() -> Snapshot:
    """Two A10Gs: 8 GB free on a (a 10 GB and a 6 GB replica), 12 GB free on b (a 12 GB replica)."""
    return snap(node("a", A10G), node("b", A10G), reservations=[
        held("s", "a", "GPU-a-0", 10240), held("t", "a", "GPU-a-0", 6144), held("u", "b", "GPU-b-0", 12288)])


def test_a_small_replica_moves_so_that_a_pending_one_fits() -> None:
    s = _fragmented()
    pending = req("p", "16GB")
    assert isinstance(place(s, [pending])[0], Unschedulable)
    (move,) = moves_of(s, [pending])
    assert (move.replica_id, move.binding.node_id, move.reason, move.room_for) == ("s", "b", "room", "p")
    during, done = after_moves(s, [move])
    assert_fits(during)  # make-before-break: the replacement's room is free while the old replica runs
    assert isinstance(place(during, [pending])[0], Unschedulable)  # the room is there only once "s" stopped
    assert place(done, [pending])[0] == place(done, [pending])[0]
    placed = place(done, [pending])[0]
    assert isinstance(placed, Binding) and placed.node_id == "a"


def test_a_replica_that_may_not_move_stays_and_nothing_else_is_tried() -> None:
    s = _fragmented()
    assert moves_of(s, [req("p", "16GB")], movable=lambda r: r.replica_id != "s") == []


def test_no_move_without_budget() -> None:
    assert moves_of(_fragmented(), [req("p", "16GB")], budget=0) == []


def test_room_is_never_made_by_taking_an_empty_gpu() -> None:
    """Two whole A10Gs on one node need "s" and "t" gone from a's first GPU: they may go into b's GPU
    only where it is in use already (an empty GPU is as precious as the room made)."""
    on_a = [held("s", "a", "GPU-a-0", 10240), held("t", "a", "GPU-a-0", 6144)]
    pending = req("p", "A10G:2")
    empty_b = snap(node("a", A10GX2), node("b", A10G), reservations=on_a)
    assert isinstance(place(empty_b, [pending])[0], Unschedulable)
    assert moves_of(empty_b, [pending]) == []
    used_b = snap(node("a", A10GX2), node("b", A10G), reservations=[*on_a, held("u", "b", "GPU-b-0", 4096)])
    moves = moves_of(used_b, [pending])
    assert sorted((m.replica_id, m.binding.node_id) for m in moves) == [("s", "b"), ("t", "b")]
    assert isinstance(place(after_moves(used_b, moves)[1], [pending])[0], Binding)


def test_a_multi_gpu_replica_gets_room_within_the_budget() -> None:
    s = snap(node("a", H100X4), node("b", H100X4), reservations=[
        held("x", "a", "GPU-a-0", 8192), held("y", "a", "GPU-a-1", 8192), held("w", "b", "GPU-b-0"),
        held("z", "b", "GPU-b-1", 40960), held("v", "b", "GPU-b-2", 40960), held("q", "b", "GPU-b-3", 40960)])
    pending = req("p", "H100:4:nvlink")
    assert isinstance(place(s, [pending])[0], Unschedulable)
    assert moves_of(s, [pending], budget=1) == []  # two replicas stand in the way
    moves = moves_of(s, [pending], budget=2)
    assert sorted(m.replica_id for m in moves) == ["x", "y"]
    assert {m.binding.node_id for m in moves} == {"b"}
    during, done = after_moves(s, moves)
    assert_fits(during)
    assert isinstance(place(done, [pending])[0], Binding)


def test_moves_for_one_pending_replica_do_not_take_the_room_made_for_another() -> None:
    """Room for "p" is made on c by moving "u" to a; "q" may not then have c, and b's "t" has nowhere to go."""
    s = snap(node("a", A10G), node("b", A10G), node("c", A10G), reservations=[
        held("s", "a", "GPU-a-0", 10240), held("t", "b", "GPU-b-0", 10240), held("u", "c", "GPU-c-0", 6144)])
    p, q = req("p", "20GB"), req("q", "20GB", priority="batch")
    assert [isinstance(d, Unschedulable) for d in place(s, [p, q])] == [True, True]
    (move,) = moves_of(s, [q, p])  # interactive first
    assert (move.replica_id, move.binding.node_id, move.room_for) == ("u", "a", "p")
    during, done = after_moves(s, [move])
    assert_fits(during)
    placed = place(done, [p])[0]
    assert isinstance(placed, Binding) and placed.node_id == "c"


def test_room_left_over_by_a_victim_is_not_free_while_it_still_runs() -> None:
    """Moving "v" (16 GB) off a's GPU makes room for "p" (12 GB) with 4 GB to spare; but "v" runs there until its
    replacement on b is ready, so the spread move of k that follows in the same pass may not take those 4 GB."""
    s = snap(node("a", A10G), node("b", A10G), node("c", A10G), reservations=[
        held("v", "a", "GPU-a-0", 16384, function="g"), held("w", "a", "GPU-a-0", 8192, function="h"),
        held("k-1", "b", "GPU-b-0", 4096, function="k"), held("k-2", "b", "GPU-b-0", 4096, function="k")])
    pending = req("p", 12288, function="p")
    moves = moves_of(s, [pending])
    assert [(m.replica_id, m.reason) for m in moves][:1] == [("v", "room")]
    during, done = after_moves(s, moves)
    assert_fits(during)
    assert_fits(done)


# --- spread -----------------------------------------------------------------------------------------


def test_replicas_crowded_on_one_node_spread_onto_a_node_that_joined() -> None:
    s = snap(node("a", A10GX2), node("b", A10GX2), reservations=[
        held("f-1", "a", "GPU-a-0", function="f"), held("f-2", "a", "GPU-a-1", function="f")])
    (move,) = moves_of(s)
    assert (move.reason, move.binding.node_id, move.binding.function) == ("spread", "b", "f")
    during, done = after_moves(s, [move])
    assert_fits(during)
    assert done.on_node["f"] == {0: 1, 1: 1}
    assert moves_of(done) == []  # spread now: nothing more to do


def test_spread_leaves_a_function_whose_replicas_are_spread_well_enough() -> None:
    s = snap(node("a", A10GX2), node("b", A10GX2), node("c", A10GX2), reservations=[
        held("f-1", "a", "GPU-a-0", 4096, function="f"), held("f-2", "a", "GPU-a-1", 4096, function="f"),
        held("f-3", "b", "GPU-b-0", 4096, function="f"), held("f-4", "c", "GPU-c-0", 4096, function="f")])
    assert moves_of(s) == []  # node a holds two of four: losing it loses no majority


def test_spread_never_moves_a_replica_that_is_still_starting() -> None:
    s = snap(node("a", A10GX2), node("b", A10GX2), reservations=[
        held("f-1", "a", "GPU-a-0", function="f"), held("f-2", "a", "GPU-a-1", function="f")])
    assert moves_of(s, movable=lambda r: False) == []
    (move,) = moves_of(s, movable=lambda r: r.replica_id == "f-2")
    assert move.replica_id == "f-2"


def test_spread_needs_room_elsewhere() -> None:
    s = snap(node("a", A10GX2), node("b", A10G), reservations=[
        held("f-1", "a", "GPU-a-0", function="f"), held("f-2", "a", "GPU-a-1", function="f"),
        held("g", "b", "GPU-b-0")])
    assert moves_of(s) == []


def test_crowding_is_tracked_through_changes() -> None:
    s = snap(node("a", A10GX2), node("b", A10GX2))
    for step in (["f-1", "f-2"], ["f-3"]):
        s = apply_decisions(s, place(s, [req(r, "4GB", function="f") for r in step]))
    assert s.crowded == build_snapshot(s.cluster, s.reservations.values()).crowded
    assert apply_decisions(s, [], removed=list(s.reservations)).crowded == {}


# --- limits over time ---------------------------------------------------------------------------------


def test_the_move_budget_limits_moves_per_pass_and_per_hour() -> None:
    budget = MoveBudget(per_pass=3, per_hour=5)
    assert budget.available(0.0) == 3
    budget = budget.spend(0.0, 3)
    assert budget.available(10.0) == 2
    budget = budget.spend(10.0, 2)
    assert budget.available(3599.0) == 0
    assert budget.available(3600.0) == 3  # the first three are an hour old
    assert budget.spend(7300.0, 1).started == (7300.0,)  # old entries are dropped


# --- properties on generated clusters -------------------------------------------------------------------

_SIZES = st.sampled_from([2048, 4096, 8192, 12288, 16384])


@st.composite
def crowded_clusters(draw: st.DrawFn) -> tuple[Snapshot, list[PlacementRequest], int]:
    nodes = [node(f"n{i}", A10GX2 if draw(st.booleans()) else H100X4) for i in range(draw(st.integers(1, 4)))]
    s = snap(*nodes)
    ids = itertools.count()
    for _ in range(draw(st.integers(0, 14))):
        function = draw(st.sampled_from(["f", "g", "h"]))
        size = draw(_SIZES)
        s = apply_decisions(s, place(s, [req(f"{function}-{next(ids)}", size, function=function)]))
    pending = [req(f"p{i}", draw(st.sampled_from(["20GB", "H100", "H100:2:nvlink", "A10G"])), function=f"p{i}")
               for i in range(draw(st.integers(0, 3)))]
    return s, pending, draw(st.integers(0, 4))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded_clusters(), st.sets(st.integers(0, 20)))
def test_moves_are_bounded_safe_and_deterministic(scenario: tuple[Snapshot, list[PlacementRequest], int],
                                                  pinned: set[int]) -> None:
    s, pending, budget = scenario
    fixed = {r for r in s.reservations if int(r.rpartition("-")[2]) in pinned}

    def movable(r: Reservation) -> bool:
        return r.replica_id not in fixed

    sizes = {r.function: req("", r.memory_mb, function=r.function) for r in s.reservations.values()}
    moves = rebalance(s, pending, sizes, movable, lambda old: f"{old}'", budget)
    assert moves == rebalance(s, pending, sizes, movable, lambda old: f"{old}'", budget)
    assert len(moves) <= budget
    assert len({m.replica_id for m in moves}) == len(moves)
    assert not {m.replica_id for m in moves} & fixed
    for m in moves:
        assert m.binding.function == s.reservations[m.replica_id].function
    during, done = after_moves(s, moves)
    assert_fits(during)  # every replacement is placed where there is room while the old replicas still run
    assert_fits(done)
    assert len(done.reservations) == len(s.reservations)  # a move replaces, it never adds or drops a replica
