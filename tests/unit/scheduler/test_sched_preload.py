"""The preloading policy: which nodes keep a zygote of which function version, within their budgets."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.placement import A10G, H100X2, held, node, req, snap

from ember_platform.scheduler import (
    Binding,
    PlacementRequest,
    Snapshot,
    apply_decisions,
    place,
)
from ember_platform.scheduler.preload import (
    HOLD,
    MAX_SPARES,
    PreloadCandidate,
    ZygoteKey,
    likely_nodes,
    next_nodes,
    plan_preload,
    preload_value,
    spares,
    starts_ahead,
)

GB = 1024


def key(service: str, version: int = 1) -> ZygoteKey:
    return ZygoteKey("app", service, version)


def cand(service: str, *, version: int = 1, size_mb: int = 4 * GB, running: str = "", likely: str = "",
         demand: float = 1.0, min_replicas: int = 0, current: bool = True) -> PreloadCandidate:
    """Nodes are one letter each: ``running="ab"`` runs on nodes a and b."""
    return PreloadCandidate(key=key(service, version), function=f"app.{service}", size_mb=size_mb,
                            running_nodes=frozenset(running), likely_nodes=tuple(likely), demand=demand,
                            min_replicas=min_replicas, current=current)


def plan(candidates: list[PreloadCandidate], budgets: dict[str, int],
         holding: dict[str, frozenset[ZygoteKey]] | None = None) -> dict[str, frozenset[ZygoteKey]]:
    return plan_preload(candidates, budgets, holding or {})


# --- where: running nodes, then likely nodes by rank -------------------------------------------------


def test_a_node_where_the_version_runs_beats_one_where_it_may_run() -> None:
    here, next_ = cand("here", running="a"), cand("next", running="b", likely="a")
    assert plan([here, next_], {"a": 4 * GB})["a"] == {key("here")}
    assert preload_value(here, "a") > preload_value(next_, "a") > 0


def test_likely_nodes_count_by_rank() -> None:
    first, second = cand("first", likely="ab"), cand("second", likely="ba")
    assert plan([first, second], {"a": 4 * GB, "b": 4 * GB}) == {"a": {key("first")}, "b": {key("second")}}
    assert preload_value(first, "a") > preload_value(first, "b") > preload_value(first, "c") == 0


def test_nodes_neither_running_nor_likely_get_nothing() -> None:
    assert plan([cand("f", running="a", likely="b")], {"a": GB * 100, "b": GB * 100, "c": GB * 100}) == {
        "a": {key("f")}, "b": {key("f")}, "c": frozenset()}


def test_every_budgeted_node_is_planned_and_no_other() -> None:
    assert plan([cand("f", running="ab")], {"a": 0}, {"b": frozenset({key("f")})}) == {"a": frozenset()}


# --- worth: demand and min_replicas --------------------------------------------------------------------


def test_an_idle_function_is_kept_where_it_runs_and_where_its_next_start_would_be() -> None:
    idle = cand("idle", running="a", likely="bc", demand=0.0)
    assert plan([idle], {n: 100 * GB for n in "abcd"}) == {"a": {key("idle")}, "b": {key("idle")},
                                                            "c": frozenset(), "d": frozenset()}


def test_a_function_scaled_to_zero_keeps_a_zygote_where_a_call_would_start_it() -> None:
    at_zero = cand("idle", likely="bc", demand=0.0)  # no replica anywhere: a call after idleness forks there
    assert plan([at_zero], {n: 100 * GB for n in "abc"}) == {"a": frozenset(), "b": {key("idle")}, "c": frozenset()}
    assert preload_value(at_zero, "b") < preload_value(cand("busy", likely="b", demand=0.01), "b")


def test_an_idle_function_yields_to_one_with_demand_or_a_guarantee() -> None:
    idle = cand("idle", running="a", demand=0.0)
    wanted = cand("wanted", likely="ba", demand=0.0, min_replicas=1)  # its second likely node, even
    assert plan([idle, wanted], {"a": 4 * GB})["a"] == {key("wanted")}


def test_min_replicas_alone_preloads_likely_nodes() -> None:
    guaranteed = cand("g", running="a", likely="b", demand=0.0, min_replicas=2)
    assert plan([guaranteed], {"a": 8 * GB, "b": 8 * GB}) == {"a": {key("g")}, "b": {key("g")}}


def test_more_demand_is_worth_more_but_not_in_proportion() -> None:
    busy, quiet = cand("busy", likely="a", demand=100.0), cand("quiet", likely="a", demand=1.0)
    assert plan([busy, quiet], {"a": 4 * GB})["a"] == {key("busy")}
    assert preload_value(busy, "a") < 10 * preload_value(quiet, "a")


# --- the budget ----------------------------------------------------------------------------------------


def test_the_budget_is_filled_by_value_per_mb() -> None:
    big = cand("big", size_mb=8 * GB, running="a", demand=3.0)  # worth 2 for 8 GB
    small = [cand(f"s{i}", size_mb=3 * GB, running="a", demand=1.0) for i in range(2)]  # worth 1 for 3 GB each
    assert plan([big, *small], {"a": 10 * GB})["a"] == {key("s0"), key("s1")}


def test_a_zygote_that_does_not_fit_is_skipped_and_smaller_ones_still_go() -> None:
    best = cand("best", size_mb=6 * GB, running="a", demand=100.0)
    nope = cand("nope", size_mb=5 * GB, running="a", demand=20.0)
    fits = cand("fits", size_mb=4 * GB, running="a", demand=1.0)
    assert plan([best, nope, fits], {"a": 10 * GB})["a"] == {key("best"), key("fits")}


def test_a_zygote_larger_than_the_budget_is_never_placed() -> None:
    assert plan([cand("huge", size_mb=9 * GB, running="a", min_replicas=1)], {"a": 8 * GB})["a"] == frozenset()


# --- hysteresis ----------------------------------------------------------------------------------------


def test_of_two_equal_zygotes_the_held_one_stays() -> None:
    a, b = cand("a-fn", running="n"), cand("b-fn", running="n")
    assert plan([a, b], {"n": 4 * GB})["n"] == {key("a-fn")}  # the tie goes to the lower key...
    assert plan([a, b], {"n": 4 * GB}, {"n": frozenset({key("b-fn")})})["n"] == {key("b-fn")}  # ...unless held


def test_a_held_zygote_gives_way_to_one_clearly_better() -> None:
    worse, better = cand("worse", running="n", demand=1.0), cand("better", running="n", demand=3.0)
    assert preload_value(better, "n") > HOLD * preload_value(worse, "n")
    assert plan([worse, better], {"n": 4 * GB}, {"n": frozenset({key("worse")})})["n"] == {key("better")}


def test_a_held_zygote_that_is_no_longer_a_candidate_is_dropped() -> None:
    assert plan([], {"n": 4 * GB}, {"n": frozenset({key("gone")})}) == {"n": frozenset()}


# --- versions ------------------------------------------------------------------------------------------


def test_an_old_version_is_kept_only_where_it_still_runs() -> None:
    old = cand("f", version=1, running="a", likely="bc", current=False)
    assert plan([old], {n: 100 * GB for n in "abc"}) == {"a": {key("f", 1)}, "b": frozenset(), "c": frozenset()}
    assert preload_value(old, "b") == 0


def test_a_new_version_replaces_the_old_one_on_its_nodes() -> None:
    budgets = {"a": 8 * GB}
    old = cand("f", version=1, running="a", current=False)
    new = cand("f", version=2, running="b", likely="a")
    during = plan([old, new], budgets, {"a": frozenset({key("f", 1)})})
    assert during == {"a": {key("f", 1), key("f", 2)}}  # room for both: preloaded before traffic moves
    tight = plan([old, new], {"a": 4 * GB}, {"a": frozenset({key("f", 1)})})
    assert tight == {"a": {key("f", 2)}}  # no room for both: the current version first
    old_stopped = msgspec.structs.replace(old, running_nodes=frozenset())
    after = plan([old_stopped, new], budgets, during)
    assert after == {"a": {key("f", 2)}}
    assert during["a"] - after["a"] == {key("f", 1)}  # the old version's zygote stops


# --- errors --------------------------------------------------------------------------------


def test_two_candidates_for_one_key_are_refused() -> None:
    with pytest.raises(ValueError, match="two preload candidates"):
        plan([cand("f", running="a"), cand("f", running="b")], {"a": GB})


@pytest.mark.parametrize("field", [{"size_mb": -1}, {"demand": -1.0}, {"demand": float("nan")}, {"min_replicas": -1}])
def test_negative_amounts_are_refused(field: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        PreloadCandidate(key=key("f"), function="app.f", **{"size_mb": 1, **field})


# --- likely_nodes: the real placement, dry run ----------------------------------------------------------


def sequential(s: Snapshot, request: PlacementRequest, count: int) -> list[str]:
    """Placing the replicas one by one, carrying the snapshot forward."""
    nodes: list[str] = []
    for i in range(count):
        decisions = place(s, [msgspec.structs.replace(request, replica_id=f"{request.replica_id}-{i}")])
        if not isinstance(decisions[0], Binding):
            break
        nodes.append(decisions[0].node_id)
        s = apply_decisions(s, decisions)
    return nodes


def test_likely_nodes_follow_placement_spread() -> None:
    s = snap(*(node(n, H100X2) for n in "abc"), reservations=(held("a", "GPU-a-0", 10 * GB, function="f"),))
    request = req("r", "10GB")
    assert likely_nodes(s, request, 3) == ("b", "c", "a")  # open nodes first (spread), then where f runs
    placed = place(s, [req(f"r{i}", "10GB") for i in range(3)])
    assert likely_nodes(s, request, 3) == tuple(d.node_id for d in placed if isinstance(d, Binding))
    assert likely_nodes(s, request, 5) == tuple(dict.fromkeys(sequential(s, request, 5)))


def test_next_nodes_are_placement_s_own_one_by_one() -> None:
    s = snap(node("a", H100X2), node("b", A10G))
    request = req("r", "20GB")
    assert next_nodes(s, request, 5) == sequential(s, request, 5)  # a node that takes several appears each time
    assert next_nodes(s, request, 0) == []


# --- spares: children a zygote keeps forked ahead, one per start expected on its node ----------------------


def test_spares_count_the_starts_expected_on_the_node() -> None:
    assert spares(["a", "b", "a"], "a") == 2
    assert spares(["a", "b", "a"], "b") == 1
    assert spares(["a", "b", "a"], "c") == 1  # where it only runs: one, for a restart
    assert spares([], "a") == 1
    assert spares(["a"] * 20, "a") == MAX_SPARES


@pytest.mark.parametrize(("demand", "low", "high", "planned", "ahead"), [
    (5.0, 0, 3, 1, 2),  # busy: up to its max_replicas
    (5.0, 0, 50, 1, MAX_SPARES),  # at most MAX_SPARES
    (5.0, 0, 3, 3, 1),  # at its max: one, for a restart
    (0.0, 1, 3, 1, 2),  # min_replicas without demand: guaranteed, may still scale
    (0.0, 0, 8, 0, 1),  # idle: its next start is one scale from zero
])
def test_starts_ahead_follow_demand_and_bounds(demand, low, high, planned, ahead) -> None:
    assert starts_ahead(demand, low, high, planned) == ahead


def test_likely_nodes_stop_where_nothing_fits() -> None:
    s = snap(node("a", A10G), node("b", A10G))
    assert sequential(s, req("r", "20GB"), 5) == ["a", "b"]
    assert likely_nodes(s, req("r", "20GB"), 5) == ("a", "b")
    assert likely_nodes(s, req("r", "40GB"), 5) == ()
    assert likely_nodes(s, req("r", "20GB"), 0) == ()


def test_likely_nodes_change_nothing_and_avoid_existing_replica_ids() -> None:
    mine = held("a", "GPU-a-0", 10 * GB, function="f")
    s = snap(node("a", H100X2), node("b", H100X2), reservations=(mine,))
    before = dict(s.reservations)
    assert likely_nodes(s, req(mine.replica_id, "10GB"), 2) == ("b", "a")
    assert dict(s.reservations) == before and s == snap(node("a", H100X2), node("b", H100X2), reservations=(mine,))


def test_likely_nodes_feed_the_plan() -> None:
    s = snap(*(node(n, H100X2) for n in "abc"), reservations=(held("a", "GPU-a-0", 10 * GB, function="app.f"),))
    likely = likely_nodes(s, req("r", "10GB", function="app.f"), 1)
    assert likely == ("b",)
    f = PreloadCandidate(key=key("f"), function="app.f", size_mb=4 * GB, running_nodes=frozenset({"a"}),
                         likely_nodes=likely, min_replicas=1)
    other = cand("other", running="bc", demand=0.0)
    assert plan([f, other], {n: 4 * GB for n in "abc"}) == {"a": {key("f")}, "b": {key("f")}, "c": {key("other")}}


# --- properties ----------------------------------------------------------------------------------------

NODES = "abcd"
_KEYS = st.lists(st.tuples(st.sampled_from(["S", "T", "U"]), st.integers(1, 3)), unique=True, max_size=9)
_NODE_SET = st.frozensets(st.sampled_from(NODES))
_LIKELY = st.lists(st.sampled_from(NODES), unique=True).map(tuple)
_HELD = st.frozensets(st.builds(ZygoteKey, st.just("app"), st.sampled_from(["S", "T", "U", "V"]), st.integers(1, 3)))


@st.composite
def candidates(draw: st.DrawFn) -> list[PreloadCandidate]:
    return [PreloadCandidate(key=key(service, version), function=f"app.{service}",
                             size_mb=draw(st.integers(0, 4096)), running_nodes=draw(_NODE_SET),
                             likely_nodes=draw(_LIKELY), demand=draw(st.sampled_from([0.0, 0.5, 3.0, 100.0])),
                             min_replicas=draw(st.integers(0, 2)), current=draw(st.booleans()))
            for service, version in draw(_KEYS)]


@settings(max_examples=300, deadline=None)
@given(candidates(), st.dictionaries(st.sampled_from(NODES), st.integers(0, 8192)),
       st.dictionaries(st.sampled_from(NODES), _HELD))
def test_plans_respect_budgets_and_rules(cs: list[PreloadCandidate], budgets: dict[str, int],
                                         holding: dict[str, frozenset[ZygoteKey]]) -> None:
    result = plan_preload(cs, budgets, holding)
    by_key = {c.key: c for c in cs}
    assert set(result) == set(budgets)
    for n, keys in result.items():
        used = sum(by_key[k].size_mb for k in keys)  # every key placed is a candidate
        assert used <= budgets[n]
        for k in keys:
            c = by_key[k]
            assert preload_value(c, n) > 0
            assert c.current or n in c.running_nodes, "an old version only where it still runs"
            assert c.demand or c.min_replicas or n in c.running_nodes or n == c.likely_nodes[0], \
                "an idle one only where it runs and where it would start next"
        for c in cs:  # greedy leaves no room that a wanted zygote would fit in
            assert c.key in keys or preload_value(c, n) == 0 or c.size_mb > budgets[n] - used
    assert plan_preload(cs[::-1], budgets, holding) == result, "the order of candidates does not matter"
    assert plan_preload(cs, budgets, result) == result, "a plan held is a plan kept: no churn"
