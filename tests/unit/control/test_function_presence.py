"""Which functions keep their own queue through a rollout (``control.queues.pulled``: those of the versions that run,
not those only kept for rollback), and what a call of a retired one says (``removal_reason``)."""

from __future__ import annotations

from support.builders import service_spec

from ember.wire import Deployment, DeployRequest, Manifest
from ember_platform.control import rollout
from ember_platform.control.queues import pulled, removal_reason


def _push(dep: Deployment | None, *functions: str, canary: int = 0, switch: bool = True) -> Deployment:
    manifest = Manifest(app="a", module="m", services=[service_spec(name) for name in functions])
    pushed = rollout.record_push(dep, "a", DeployRequest(bundle_sha256="x" * (len(functions) + 1), manifest=manifest,
                                                         canary_percent=canary), 0.0)
    return (rollout.switch(pushed, True, 1.0) or pushed) if switch else pushed


def test_a_push_without_a_function_keeps_it_until_its_version_takes_the_traffic() -> None:
    v1 = _push(None, "f", "g")
    rolling = _push(v1, "f", switch=False)
    assert pulled(rolling) == {"f", "g"}  # version 1 serves until version 2 is ready
    switched = rollout.switch(rolling, True, 2.0)
    assert switched is not None and pulled(switched) == {"f"}
    assert switched.release(1) is not None  # kept for rollback, yet it pulls nothing
    assert removal_reason(switched, "g") == ("the function 'g' was removed from the app 'a' in version 2 before the "
                                             "call ran")


def test_a_canary_without_a_function_keeps_it_beside_its_stable_version_until_promoted() -> None:
    canary = _push(_push(None, "f", "g"), "f", canary=50)
    assert pulled(canary) == {"f", "g"}
    promoted = rollout.switch(rollout.promote(canary, 2.0), True, 3.0)
    assert promoted is not None and pulled(promoted) == {"f"}
    back = rollout.rollback(canary, 0, 4.0)  # a canary rolled back: version 1 alone
    assert pulled(back) == {"f", "g"}


def test_a_rollback_to_a_version_without_a_function_says_so() -> None:
    v2 = _push(_push(None, "f"), "f", "g")
    back = rollout.rollback(v2, 1, 5.0, ready={1})
    assert pulled(back) == {"f"}
    assert removal_reason(back, "g") == ("the app 'a' was rolled back to version 1, which has no function 'g', before "
                                        "the call ran")


def test_the_version_that_removed_a_function_is_named_after_later_pushes() -> None:
    dep = _push(_push(_push(None, "f", "g"), "f"), "f", "h")
    assert [r.version for r in dep.releases] == [1, 2] and dep.version == 3
    assert "in version 2 before" in removal_reason(dep, "g")
    assert removal_reason(dep, "old") == ("the function 'old' was removed from the app 'a' (version 3 has none) "
                                          "before the call ran")
