"""Host locality: NUMA topology (sysfs or declared), where a replica is pinned, and host memory counted."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
from support.builders import slot

from ember_runtime.agent import inventory, numa
from ember_runtime.agent.node import NodeAgent
from ember_runtime.agent.sandbox import prepare_child

TWO_NODES = {0: frozenset(range(0, 4)), 1: frozenset(range(4, 8))}


@pytest.mark.parametrize(("text", "cpus"), [
    ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}), ("5", {5}), ("", set()), ("0-1,", {0, 1})])
def test_the_kernels_cpu_lists_parse(text: str, cpus: set[int]) -> None:
    assert numa.parse_cpulist(text) == cpus


@pytest.mark.parametrize(("text", "message"), [
    ("0-x", r"'0-x' is not a CPU id or range"), ("3-1", r"'3-1' is not a CPU range"),
    ("-1", r"not a CPU"), ("0-99999999", r"'0-99999999' is not a CPU range from 0 to 65535")])
def test_a_bad_cpu_list_says_which_part(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        numa.parse_cpulist(text)


def test_cpu_lists_are_written_as_the_kernel_writes_them() -> None:
    assert numa.format_cpulist({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert numa.format_cpulist(frozenset()) == ""


def test_the_topology_comes_from_sysfs(tmp_path: Path) -> None:
    for node, cpus in {0: "0-3\n", 1: "4-7\n", 2: "\n"}.items():  # node 2: memory only (CXL, say)
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus)
    (tmp_path / "online").write_text("0-2\n")
    assert numa.read_topology(tmp_path) == TWO_NODES
    assert numa.read_topology(tmp_path / "absent") == {}


def test_this_hosts_topology_covers_the_cpus_it_runs_on() -> None:
    topology = numa.read_topology()
    if not topology:
        pytest.skip("this host's sysfs does not show NUMA nodes")
    assert numa.allowed_cpus() <= frozenset().union(*topology.values())


def test_a_replica_is_pinned_to_its_gpus_node_where_the_host_has_several() -> None:
    everything = frozenset(range(8))
    assert numa.pinning(TWO_NODES, 1, everything) == numa.Pinning(
        frozenset(range(4, 8)), "pinned to NUMA node 1: CPUs 4-7")
    assert numa.pinning({0: everything}, 0, everything).cpus is None  # one node: nothing to choose
    assert numa.pinning(TWO_NODES, -1, everything).cpus is None  # unknown, or GPUs on both nodes


def test_cpus_that_do_not_exist_here_are_skipped_with_a_warning() -> None:
    pin = numa.pinning({0: frozenset({0}), 1: frozenset({60000, 60001})}, 1, frozenset({0, 1}))
    assert pin == numa.Pinning(None, "the CPUs of NUMA node 1 (60000-60001) do not exist here or are not allowed "
                                     "(this agent may use 0-1): not pinned", warn=True)
    missing = numa.pinning(TWO_NODES, 3, frozenset(range(8)))
    assert (missing.cpus, missing.warn) == (None, True)
    assert "NUMA node 3 is not in this host's topology (nodes 0, 1)" in missing.why


def test_only_the_cpus_this_agent_may_use_are_given() -> None:
    pin = numa.pinning(TWO_NODES, 0, frozenset({1, 2, 5}))  # a cpuset narrower than the node
    assert pin.cpus == {1, 2}
    assert pin.why == "pinned to NUMA node 0: CPUs 1-2 (of 0-3; the rest is not allowed here)"


def test_thread_pools_match_the_pinned_cpus_unless_the_operator_set_them() -> None:
    assert numa.thread_env(frozenset({4, 5, 6}), {"MKL_NUM_THREADS": "2"}) == {
        "OMP_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "3", "NUMEXPR_NUM_THREADS": "3"}
    assert numa.thread_env(None, {}) == {}


def test_host_memory_is_counted_against_the_nodes_ram() -> None:
    host = numa.HostMemory(total_mb=16_384)
    assert host.reserve("a", 8192) and host.reserve("b", 8192)
    assert not host.reserve("c", 1)
    assert host.summary() == "host memory: 16385 MB of 16384 MB reserved by 3 replicas"
    host.release("c")
    assert host.reserved_mb == 16_384
    assert numa.HostMemory(total_mb=0).reserve("a", 10**9)  # RAM unknown: nothing to over-commit


# --- declared in an inventory --------------------------------------------------------------------

DECLARED = """\
[[gpu]]
model = "H100-80GB"
numa_node = 0
[[gpu]]
model = "L4-24GB"
numa_node = 1
[[numa]]
node = 0
cpus = "{cpu}"
[[numa]]
node = 1
cpus = "60000-60001"
"""


def test_a_declared_inventory_gives_its_numa_nodes(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(DECLARED.format(cpu=0))
    assert inventory.load_numa(path) == {0: {0}, 1: {60000, 60001}}
    path.write_text('[[gpu]]\nmodel = "H100-80GB"\nnuma_node = 1\n')
    assert inventory.load_numa(path) is None  # not declared: this machine's
    assert inventory.load_numa(None) is None


@pytest.mark.parametrize(("text", "message"), [
    ('[[numa]]\nnode = 0\ncpus = "0-x"\n', r"^inv\.toml:3: numa\[0\]\.cpus: '0-x' is not a CPU id or range"),
    ('[[numa]]\nnode = 0\ncpus = "0"\n[[numa]]\nnode = 0\ncpus = "1"\n',
     r"^inv\.toml:5: numa\[1\]\.node: a NUMA node is a distinct id >= 0, got 0"),
    ('[[numa]]\nnode = 0\ncpus = ""\n', r"^inv\.toml:3: numa\[0\]\.cpus: lists no CPU"),
    ('[[numa]]\nnode = 0\ncores = "0"\n', r"^inv\.toml:3: numa\[0\]\.cores: Object contains unknown field"),
    ('[[gpu]]\nmodel = "H100-80GB"\nnuma_node = 2\n[[numa]]\nnode = 0\ncpus = "0"\n',
     r"^inv\.toml:3: gpu\[0\]\.numa_node: NUMA node 2 is not declared in \[\[numa\]\]"),
])
def test_bad_numa_declarations_say_where_and_what(text: str, message: str) -> None:
    with pytest.raises(inventory.InventoryError, match=message):
        inventory.parse(text, source="inv.toml")


# --- the agent -----------------------------------------------------------------------------------


def test_the_agent_pins_a_replica_process_to_its_gpus_node(tmp_path: Path) -> None:
    cpu = min(os.sched_getaffinity(0))
    declared = tmp_path / "node.toml"
    declared.write_text(DECLARED.format(cpu=cpu))
    agent = NodeAgent("nats://127.0.0.1:1", tmp_path, inventory=declared)
    near = slot("r-0", "GPU-virtual-0")
    far = slot("r-1", "GPU-virtual-1", index=1, numa_node=1)
    pin = agent._pinning(near)  # the scheduler left numa_node unset: the node's own inventory says 0
    assert pin.cpus == {cpu}
    assert (agent._pinning(far).cpus, agent._pinning(far).warn) == (None, True)
    # The agent starts replicas with this preexec step: the process, and every thread it starts, stays there.
    script = "import threading; t = threading.Thread(target=input); t.start(); print(t.native_id, flush=True)"
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            preexec_fn=partial(prepare_child, pin.cpus))
    try:
        assert proc.stdout is not None
        thread = int(proc.stdout.readline())
        for status in (Path(f"/proc/{proc.pid}/status"), Path(f"/proc/{proc.pid}/task/{thread}/status")):
            lines = status.read_text().splitlines()
            assert next(line for line in lines if line.startswith("Cpus_allowed_list:")).split()[1] == str(cpu)
    finally:
        proc.communicate("\n", timeout=30)
