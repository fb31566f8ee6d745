"""Quotas cap the replicas services may have: minimums first, a quota over min_replicas, GPU memory counted."""

from __future__ import annotations

from ember._resources import parse_gpu
from ember.wire import Device, Quota, SlotAssignment
from ember_platform.quotas.caps import Want, cap, replica_gpu_mb, slot_gpu_mb, usage


def test_no_quota_caps_nothing() -> None:
    wants = [Want("a", "f", minimum=1, wanted=5)]
    assert cap([], wants)[("a", "f")].allowed == 5
    assert cap([Quota(name="calls", apps="*", rate_per_s=1.0)], wants)[("a", "f")].allowed == 5


def test_a_replicas_quota_wins_over_min_replicas_and_says_so() -> None:
    capped = cap([Quota(name="small", apps="team-*", max_replicas=1)],
                 [Want("team-x", "f", minimum=3, wanted=3), Want("other", "g", minimum=2, wanted=2)])
    assert capped[("team-x", "f")].allowed == 1
    assert "quota 'small'" in capped[("team-x", "f")].reason and "min_replicas 3" in capped[("team-x", "f")].reason
    assert capped[("other", "g")].allowed == 2 and capped[("other", "g")].reason == ""


def test_minimums_come_first_across_the_quotas_services() -> None:
    capped = cap([Quota(name="q", apps="a*", max_replicas=4)],
                 [Want("a1", "f", minimum=1, wanted=4), Want("a2", "f", minimum=2, wanted=3)])
    assert capped[("a1", "f")].allowed == 2 and capped[("a2", "f")].allowed == 2
    assert "min_replicas" not in capped[("a2", "f")].reason  # held above its minimum


def test_gpu_memory_is_summed_over_the_matching_replicas() -> None:
    quota = Quota(name="mem", apps="*", max_gpu_memory_mb=80 * 1024)
    capped = cap([quota], [Want("a", "f", minimum=0, wanted=5, gpu_mb=24 * 1024), Want("b", "cpu", 1, 3)])
    assert capped[("a", "f")].allowed == 3  # 72 GB of 80
    assert capped[("b", "cpu")].allowed == 3  # no GPU memory: not held
    both = cap([quota, Quota(name="n", apps="a", max_replicas=2)], [Want("a", "f", 0, 5, 24 * 1024)])
    assert both[("a", "f")].allowed == 2 and "'n'" in both[("a", "f")].reason


def test_what_a_replica_counts() -> None:
    gpus = [Device(kind="gpu", index=0, name="NVIDIA A10G", uuid="G0", memory_total_mb=24576),
            Device(kind="gpu", index=1, name="NVIDIA H100 80GB", uuid="G1", memory_total_mb=81920),
            Device(kind="cpu", index=0, name="cpu")]
    assert replica_gpu_mb(parse_gpu(None), gpus) == 0
    assert replica_gpu_mb(parse_gpu("24GB"), gpus) == 24 * 1024
    assert replica_gpu_mb(parse_gpu(2), gpus) == 2 * 81920  # whole GPUs: the largest it could get
    assert replica_gpu_mb(parse_gpu("A10G"), gpus) == 24576
    assert replica_gpu_mb(parse_gpu("1g.10gb"), gpus) == 10 * 1024
    totals = {"G0": 24576, "G1": 81920}
    whole = SlotAssignment(replica_id="r1", app="a", service="f", version=1, index=0, gpu_uuids=["G1"])
    shared = SlotAssignment(replica_id="r2", app="a", service="f", version=1, index=1, gpu_uuids=["G0", "G1"],
                            memory_mb=1000)
    other = SlotAssignment(replica_id="r3", app="b", service="f", version=1, index=0)
    assert slot_gpu_mb(whole, totals) == 81920 and slot_gpu_mb(shared, totals) == 2000
    assert usage(Quota(name="q", apps="a", max_replicas=9), [whole, shared, other], totals) == (2, 83920)
