"""The agent samples its GPUs' utilisation and memory again with each heartbeat (for metrics and the console)."""

from __future__ import annotations

import copy

from test_inventory import NODE_A_NVML, FakeNvml

from ember_runtime.agent import inventory


def test_a_sample_reads_utilisation_and_free_memory_again() -> None:
    devices = inventory.from_nvml(FakeNvml(NODE_A_NVML))
    now = copy.deepcopy(NODE_A_NVML)
    now[0].update(util=87, used_mb=40960)
    sampled = inventory.sample_usage(devices, FakeNvml(now))
    assert (sampled[0].utilization, sampled[0].memory_free_mb) == (0.87, 81920 - 40960)
    assert (sampled[2].utilization, sampled[2].memory_free_mb) == (0.30, 24576 - 2048)
    assert [d.uuid for d in sampled] == [d.uuid for d in devices]
    assert [d for d in sampled if d.mig_profile] == [d for d in devices if d.mig_profile]  # slices kept as listed


def test_without_a_driver_the_devices_are_kept() -> None:
    devices = inventory.from_nvml(FakeNvml(NODE_A_NVML))
    assert inventory.sample_usage(devices, FakeNvml(NODE_A_NVML, driver=False)) == devices
