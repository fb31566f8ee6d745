"""A test subject for the node agent's enforcement on a declared (virtual) inventory.

``hog`` "allocates" GPU memory the way a virtual GPU allows: it declares it to the agent's virtual
driver (the process table in ``EMBER_VIRTUAL_GPU_PROCESSES``), for itself and for a worker process it
starts, so that only their sum breaks the reservation. ``far`` sits on a GPU whose NUMA node has no CPUs
on this machine.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import ember

app = ember.App("enforce")
_workers: list[subprocess.Popen[str]] = []

# The worker declares its share, says so, and lives until its replica closes the pipe (or dies).
_WORKER = """
import json, os, sys
from pathlib import Path
table, device, mb = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(table / f".{os.getpid()}").write_text(json.dumps({device: mb}))
(table / f".{os.getpid()}").replace(table / str(os.getpid()))
print(os.getpid(), flush=True)
sys.stdin.read()
"""


def _declare(pid: int, device: str, mb: int) -> None:
    table = Path(os.environ["EMBER_VIRTUAL_GPU_PROCESSES"])
    staged = table / f".{pid}"
    staged.write_text(json.dumps({device: mb}))
    staged.replace(table / str(pid))  # whole, never half-written


@app.function(gpu="H100:8GB")
def hog(own_mb: int, worker_mb: int) -> list[int]:
    """Use ``own_mb`` here and ``worker_mb`` in a child process; returns both pids."""
    device = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]
    _declare(os.getpid(), device, own_mb)
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, os.environ["EMBER_VIRTUAL_GPU_PROCESSES"], device,
                               str(worker_mb)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    _workers.append(worker)
    assert worker.stdout is not None
    return [os.getpid(), int(worker.stdout.readline())]


@app.function(gpu="L4", memory="1GB")
def far() -> int:
    return os.getpid()
