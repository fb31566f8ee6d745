"""The rollout policy as pure functions: push, canary, promote, rollback, the traffic switch, pinned versions."""

from __future__ import annotations

import collections
import random
from types import SimpleNamespace

import msgspec
import pytest
from support.builders import service_spec

from ember._errors import ConflictError, InvalidInputError, NotFoundError
from ember.wire import Deployment, DeployRequest, Manifest, ScaleBounds, TrafficShare
from ember_platform.control import rollout


def _request(sha: str, canary: int = 0) -> DeployRequest:
    return DeployRequest(bundle_sha256=sha, manifest=Manifest(app="a", module="m", services=[service_spec()]),
                         canary_percent=canary)


def _pushed(*shas: str) -> Deployment:
    """Versions 1.. of app "a", one per sha, each rolled out and switched to."""
    dep = None
    for i, sha in enumerate(shas):
        dep = rollout.record_push(dep, "a", _request(sha), float(i))
        dep = rollout.switch(dep, True, float(i)) or dep
    assert dep is not None
    return dep


def _shares(dep: Deployment) -> list[tuple[int, int]]:
    return [(s.version, s.percent) for s in dep.serving()]


def test_a_first_push_serves_at_once() -> None:
    dep = rollout.record_push(None, "a", _request("x"), 0.0)
    assert (dep.version, _shares(dep), dep.latest) == (1, [(1, 100)], 1)
    assert not rollout.rolling_out(dep)


def test_a_new_version_takes_traffic_only_once_ready() -> None:
    v1 = _pushed("x")
    v2 = rollout.record_push(v1, "a", _request("y"), 5.0)
    assert v2.version == 2 and _shares(v2) == [(1, 100)] and rollout.rolling_out(v2)
    assert v2.running() == {1, 2}
    assert rollout.switch(v2, False, 6.0) is None
    switched = rollout.switch(v2, True, 7.0)
    assert switched is not None and _shares(switched) == [(2, 100)] and switched.switched_at == 7.0
    assert switched.running() == {2} and [r.version for r in switched.releases] == [1]


def test_a_canary_takes_its_share_then_promote_or_rollback() -> None:
    v1 = _pushed("x")
    canary = rollout.record_push(v1, "a", _request("y", canary=20), 1.0)
    assert (canary.version, canary.stable, canary.canary_percent) == (2, 1, 20)
    assert _shares(canary) == [(1, 100)]  # not ready yet
    live = rollout.switch(canary, True, 2.0)
    assert live is not None and _shares(live) == [(1, 80), (2, 20)]
    promoted = rollout.promote(live, 3.0)
    assert _shares(promoted) == [(1, 80), (2, 20)] and rollout.rolling_out(promoted)  # the loop switches when ready
    done = rollout.switch(promoted, True, 4.0)
    assert done is not None and _shares(done) == [(2, 100)] and not done.canary_percent
    back = rollout.rollback(live, 0, 5.0)  # the canary goes, its stable version serves alone at once
    assert back.version == 1 and _shares(back) == [(1, 100)] and back.switched_at == 5.0
    assert {r.version for r in back.releases} == {2}


def test_conflicts() -> None:
    v1 = _pushed("x")
    with pytest.raises(ConflictError, match="no canary"):
        rollout.promote(v1, 1.0)
    with pytest.raises(ConflictError, match="no version before"):
        rollout.rollback(v1, 0, 1.0)
    with pytest.raises(ConflictError, match="push it first"):
        rollout.record_push(None, "a", _request("x", canary=10), 0.0)
    canary = rollout.record_push(v1, "a", _request("y", canary=10), 1.0)
    with pytest.raises(ConflictError, match="already has a canary"):
        rollout.record_push(canary, "a", _request("z", canary=10), 2.0)
    with pytest.raises(ConflictError, match="already serves"):
        rollout.rollback(v1, 1, 1.0)
    for bad in (-1, 100, 250):
        with pytest.raises(InvalidInputError) as err:
            rollout.record_push(v1, "a", _request("y", canary=bad), 1.0)
        assert err.value.field == "$.canary_percent"


def test_rollback_to_a_kept_version_and_not_to_others() -> None:
    dep = _pushed("x", "y", "z")
    assert dep.version == 3 and [r.version for r in dep.releases] == [1, 2]
    back = rollout.rollback(dep, 1, 1.0)
    assert back.version == 1 and back.bundle_sha256 == "x" and _shares(back) == [(3, 100)]  # v1 starts first
    assert rollout.switch(back, True, 2.0) is not None
    with pytest.raises(NotFoundError, match="no version 7"):
        rollout.rollback(dep, 7, 1.0)
    again = rollout.record_push(rollout.switch(back, True, 2.0), "a", _request("w"), 3.0)
    assert again.version == 4  # after a rollback, a push takes the next number


def test_a_bare_rollback_during_a_rollout_keeps_the_serving_version() -> None:
    v1 = _pushed("x")
    rolling = rollout.record_push(v1, "a", _request("y"), 1.0)
    back = rollout.rollback(rolling, 0, 2.0)
    assert back.version == 1 and _shares(back) == [(1, 100)] and back.running() == {1}


@pytest.mark.parametrize("percent", [50, 60, 99])
def test_a_bare_rollback_of_a_canary_taking_half_or_more_goes_back_to_its_stable_version(percent: int) -> None:
    """The canary took the largest share, and a bare rollback went to the newest version before it instead of its
    stable one: here v2, rolled back from as bad, took every call again."""
    v2 = _pushed("x", "y")
    bad_undone = rollout.switch(rollout.rollback(v2, 1, 2.0), True, 3.0)
    assert bad_undone is not None and _shares(bad_undone) == [(1, 100)]
    canary = rollout.record_push(bad_undone, "a", _request("z", canary=percent), 4.0)
    live = rollout.switch(canary, True, 5.0)
    assert live is not None and (live.version, live.stable) == (3, 1)
    back = rollout.rollback(live, 0, 6.0)
    assert back.version == 1 and _shares(back) == [(1, 100)]


def test_kept_versions_are_bounded_and_serving_ones_stay() -> None:
    dep = _pushed(*(f"sha{i}" for i in range(rollout.KEEP_VERSIONS + 5)))
    assert len(dep.releases) == rollout.KEEP_VERSIONS
    assert dep.releases[0].version == dep.version - rollout.KEEP_VERSIONS


def test_split_follows_the_shares() -> None:
    shares = [TrafficShare(version=1, percent=80), TrafficShare(version=2, percent=20)]
    rng = random.Random(7)
    seen = collections.Counter(rollout.split(shares, rng.random()) for _ in range(20_000))
    assert abs(seen[2] / 20_000 - 0.20) < 0.02
    assert rollout.split(shares, 0.0) == 1 and rollout.split(shares, 0.999) == 2


@pytest.mark.parametrize("raw", ["", "0", "01", "-1", "1.5", "abc", "../2", "1/2", "v", "%2e", "\u0661", "9" * 10,
                                 "1 ", "1\x00"])
def test_garbage_versions_are_refused(raw: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        rollout.parse_version(raw)
    assert err.value.field == "version"


def test_versions_parse() -> None:
    assert rollout.parse_version("3") == rollout.parse_version("v3") == 3
    assert rollout.parse_version("999999999") == 999_999_999


def test_the_version_that_leaves_the_traffic_is_warm_and_a_rollback_to_it_is_at_once() -> None:
    v2 = _pushed("x", "y")
    assert (v2.warm, v2.warm_since) == (1, 1.0)
    waiting = rollout.rollback(v2, 0, 5.0)  # its replicas are gone: it serves once they are ready again
    assert _shares(waiting) == [(2, 100)] and waiting.warm == 1
    at_once = rollout.rollback(v2, 0, 5.0, ready={1})
    assert _shares(at_once) == [(1, 100)] and (at_once.warm, at_once.warm_since) == (2, 5.0)
    assert _shares(rollout.rollback(v2, 1, 5.0, ready={2})) == [(2, 100)]  # ready, but not the warm one


def _ready(*versions: int) -> list[SimpleNamespace]:
    """A ready replica of service "s" of each of ``versions`` (repeated: several)."""
    return [SimpleNamespace(version=v, service="s", state="ready") for v in versions]


def test_a_rollback_to_the_warm_version_is_at_once_only_with_as_many_ready_replicas_as_serve() -> None:
    """A warm version keeps one replica (its min_replicas) while the version leaving served on three: switching to it
    at once left every call on that one replica while the others started."""
    v2 = msgspec.structs.replace(_pushed("x", "y"), scale={"s": ScaleBounds(min_replicas=1, max_replicas=10)})
    assert rollout.ready_to_serve(v2, _ready(1, 2, 2, 2)) == {2}  # v2 serves on three; warm v1 has one
    waiting = rollout.rollback(v2, 0, 5.0, ready=rollout.ready_to_serve(v2, _ready(1, 2, 2, 2)))
    assert waiting.version == 1 and _shares(waiting) == [(2, 100)]  # the loop starts v1's replicas, then switches
    assert rollout.ready_to_serve(v2, _ready(1, 1, 1, 2, 2, 2)) == {1, 2}
    at_once = rollout.rollback(v2, 0, 5.0, ready=rollout.ready_to_serve(v2, _ready(1, 1, 1, 2, 2, 2)))
    assert _shares(at_once) == [(1, 100)]
    assert rollout.ready_to_serve(v2, [SimpleNamespace(version=1, service="s", state="starting")]) == set()


def test_a_warm_version_that_serves_again_is_no_longer_warm() -> None:
    v2 = _pushed("x", "y")
    back = rollout.rollback(v2, 1, 5.0)
    switched = rollout.switch(back, True, 6.0)
    assert switched is not None and _shares(switched) == [(1, 100)] and (switched.warm, switched.warm_since) == (2, 6.0)
    canary = rollout.record_push(_pushed("x"), "a", _request("y", canary=20), 3.0)
    promoted = rollout.switch(rollout.promote(rollout.switch(canary, True, 4.0) or canary, 5.0), True, 6.0)
    assert promoted is not None and _shares(promoted) == [(2, 100)] and promoted.warm == 1
