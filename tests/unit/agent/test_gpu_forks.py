"""A sandboxed replica given GPUs is not forked from its version's zygote: the zygote's sandbox is built with no GPU
device nodes, and a forked replica stays in that sandbox, so it would not reach its GPUs (its start is fresh, or
from a warm start, whose sandbox holds them). tests/integration/test_gpu_replicas.py checks it on a real GPU,
tests/integration/test_enforcement.py on a declared inventory's virtual GPUs (their stand-in device nodes)."""

from __future__ import annotations

from ember_runtime.agent.sandbox import NO_SANDBOX, Confinement, Sandbox
from ember_runtime.agent.slots import unforkable

BWRAP = Sandbox("/usr/bin/bwrap")
GPU0 = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm")


def test_a_sandboxed_replica_with_gpu_device_nodes_starts_fresh() -> None:
    assert "GPU device nodes" in unforkable(Confinement(sandbox=BWRAP, devices=GPU0))


def test_a_cpu_replica_forks() -> None:
    assert unforkable(Confinement(sandbox=BWRAP)) == ""  # no device node


def test_an_unsandboxed_replica_forks_the_zygote_sees_the_nodes_devices() -> None:
    assert unforkable(Confinement(sandbox=NO_SANDBOX, devices=GPU0)) == ""
