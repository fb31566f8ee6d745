"""A zygote keeps a spare (a child forked ahead of its request) for each start expected on its node: the replicas
placed there that have not started yet count, so that the preloader's next look, made between a scale-up's placement
and its agent's requests, does not take from the zygote the spares those replicas are about to be handed."""

from __future__ import annotations

from support.builders import deployment, service_spec, slot
from support.placement import A10G, node, snap

from ember.wire import SlotAssignment
from ember_platform.control.preloader import Preloader


def _spares(plan: list[SlotAssignment], reported: set[str]) -> int:
    """The spares of the zygote of service "s" (one replica at least, three at most) on a node running ``plan``."""
    n1 = node("n1", A10G, memory_gb=16)
    dep = deployment(service_spec("s", snap=True, min_replicas=1, max_replicas=3))
    zygotes = Preloader(demand=lambda app, svc: 0.0).zygotes({"n1": plan}, {"n1": n1}, {"a": dep},
                                                            lambda: snap(n1), now=0.0, reported=reported)
    (zygote,) = zygotes["n1"]
    return zygote.spares


def test_replicas_placed_and_not_started_keep_their_spares() -> None:
    three = [slot(f"a-s-{i}", index=i) for i in range(3)]  # at its maximum: the next start is a restart
    assert _spares(three, {"a-s-0", "a-s-1", "a-s-2"}) == 1
    assert _spares(three, {"a-s-0"}) == 3  # two placed, not started: theirs, and one for a restart
    assert _spares(three[:1], {"a-s-0"}) == 2  # below its maximum: one for each start it may add
    assert _spares(three[:1], set()) == 3  # the first replica, placed and not started, and the two it may add


def test_only_the_zygotes_own_replicas_count() -> None:
    beside = [slot("a-s-0", index=0), slot("a-s-1", index=1), slot("a-t-0", service="t"), slot("a-s-9", version=2)]
    assert _spares(beside, {"a-s-0"}) == 2  # a-s-1 is starting, and one more it may add; not another service's
    # replica, nor another version's



def test_a_zygote_is_bounded_by_its_services_memory_as_its_replicas_are() -> None:
    """The zygote runs the app's code (its setup loads the model): it had no memory bound, so a setup that grew
    without one could take the node's memory from every app's replicas."""
    n1 = node("n1", A10G, memory_gb=16)
    dep = deployment(service_spec("s", snap=True, min_replicas=1, memory_mb=2048))
    zygotes = Preloader(demand=lambda app, svc: 0.0).zygotes({"n1": [slot("a-s-0")]}, {"n1": n1}, {"a": dep},
                                                            lambda: snap(n1), now=0.0, reported={"a-s-0"})
    (zygote,) = zygotes["n1"]
    assert zygote.host_memory_mb == 2048
