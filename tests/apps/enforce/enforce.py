"""A test subject for the node agent's enforcement on a declared (virtual) inventory.

``hog`` "allocates" GPU memory the way a virtual GPU allows: it declares it to the agent's virtual
driver (the process table in ``EMBER_VIRTUAL_GPU_PROCESSES``), for itself and for a worker process it
starts, so that only their sum breaks the reservation. Each keeps its entry open while it lives, as a
driver's context: the agent finds whose it is by that, since in its sandbox a process knows only its own
pid namespace's pids. ``far`` sits on a GPU whose NUMA node has no CPUs
on this machine. ``Pinned`` runs on a node without sandboxes (forked from its zygote there), ``Held`` on the
sandboxed one, forked from a zygote whose sandbox holds its GPU's (stand-in) device node.
"""

import json
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import ember

app = ember.App("enforce")
_workers: list[subprocess.Popen[str]] = []

# The worker declares its share, says so, and lives until its replica closes the pipe (or dies).
_WORKER = """
import json, os, sys, uuid
from pathlib import Path
table, device, mb = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
name = uuid.uuid4().hex
fd = os.open(table / f".{name}", os.O_CREAT | os.O_WRONLY, 0o644)
os.write(fd, json.dumps({device: mb}).encode())
os.rename(table / f".{name}", table / name)
print(os.getpid(), flush=True)
sys.stdin.read()
"""
_held: list[int] = []  # the descriptors of this process's entries: its "contexts" on the virtual GPU


def _declare(device: str, mb: int) -> None:
    table = Path(os.environ["EMBER_VIRTUAL_GPU_PROCESSES"])
    name = uuid.uuid4().hex  # any name: the entry is this process's while it holds it open
    fd = os.open(table / f".{name}", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, json.dumps({device: mb}).encode())
    os.rename(table / f".{name}", table / name)  # whole, never half-written
    _held.append(fd)


@app.function(gpu="H100:8GB")
def hog(own_mb: int, worker_mb: int) -> list[int]:
    """Use ``own_mb`` here and ``worker_mb`` in a child process; returns both pids (in its sandbox)."""
    device = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]
    _declare(device, own_mb)
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, os.environ["EMBER_VIRTUAL_GPU_PROCESSES"], device,
                               str(worker_mb)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    _workers.append(worker)
    assert worker.stdout is not None
    return [os.getpid(), int(worker.stdout.readline())]


def gpu_nodes() -> list[str]:
    """The GPU device nodes this process sees: character devices, as a real GPU's are."""
    found = sorted(name for name in os.listdir("/dev") if name.startswith("nvidia"))
    return [name for name in found if stat.S_ISCHR(os.stat(f"/dev/{name}").st_mode)]


@app.function(gpu="L4", memory="1GB")
def far() -> list[str]:
    return gpu_nodes()


@app.model(gpu="A10G:1GB")
class Pinned:
    """Forked from its zygote (a snap setup): its model thread is made before the fork request, which names the
    CPUs; it must run on them all the same."""

    @ember.setup(snap=True)
    def load(self) -> None:
        self.loaded = True

    @ember.method()
    def cpus(self) -> list[int]:
        """The CPUs the thread running this (the model thread) may use."""
        return sorted(os.sched_getaffinity(0))


@app.model(gpu="H100:1GB")
class Held:
    """A snap setup too, on the sandboxed node."""

    @ember.setup(snap=True)
    def load(self) -> None:
        self.loaded = True

    @ember.method()
    def nodes(self) -> list[str]:
        return gpu_nodes()
