"""A sandboxed replica given GPUs forks only from a zygote whose sandbox holds exactly its GPUs' device nodes: a
forked replica stays in its zygote's sandbox, so from any other zygote it would not reach its GPUs (or would reach
another's), and it starts fresh instead, or from a warm start, whose sandbox holds them.
tests/integration/test_gpu_replicas.py checks it on a real GPU, tests/integration/test_enforcement.py on a declared
inventory's virtual GPUs (their stand-in device nodes)."""

from __future__ import annotations

from ember_runtime.agent.sandbox import NO_SANDBOX, Confinement, Sandbox
from ember_runtime.agent.slots import unforkable

BWRAP = Sandbox("/usr/bin/bwrap")
GPU0 = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm")
GPU01 = ("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm")


def test_a_sandboxed_replica_forks_from_a_zygote_that_holds_its_gpus() -> None:
    assert unforkable(Confinement(sandbox=BWRAP, devices=GPU0), ["GPU-a"], ["GPU-a"]) == ""
    assert unforkable(Confinement(sandbox=BWRAP, devices=GPU01), ["GPU-a", "GPU-b"], ["GPU-b", "GPU-a"]) == ""


def test_a_sandboxed_replica_starts_fresh_beside_a_zygote_without_its_gpus() -> None:
    assert "holds no GPU device nodes" in unforkable(Confinement(sandbox=BWRAP, devices=GPU0), ["GPU-a"], [])
    why = unforkable(Confinement(sandbox=BWRAP, devices=GPU0), ["GPU-a"], ["GPU-b"])
    assert why == "the zygote's sandbox holds GPU(s) GPU-b, not this replica's GPU-a"
    # a zygote of more GPUs than the replica's: it would reach one it was not given
    assert unforkable(Confinement(sandbox=BWRAP, devices=GPU0), ["GPU-a"], ["GPU-a", "GPU-b"]) != ""


def test_a_cpu_replica_forks() -> None:
    assert unforkable(Confinement(sandbox=BWRAP), [], []) == ""  # no device node


def test_a_sandboxed_replica_given_gpus_without_device_nodes_forks_only_from_a_zygote_of_those_gpus() -> None:
    assert unforkable(Confinement(sandbox=BWRAP), ["GPU-a"], ["GPU-a"]) == ""
    assert unforkable(Confinement(sandbox=BWRAP), ["GPU-a"], ["GPU-b"]) != ""  # whatever nodes either one holds


def test_an_unsandboxed_replica_forks_the_zygote_sees_the_nodes_devices() -> None:
    assert unforkable(Confinement(sandbox=NO_SANDBOX, devices=GPU0), ["GPU-a"], []) == ""
