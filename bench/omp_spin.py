"""Do torch's OpenMP threads spin between calls? The MLP of bench/apps/per_call (batch 32) every 2 ms, 500 times,
in a fresh process per setting; CPU per call (the process's, all threads) against the forward pass's wall time.

Usage
    python bench/omp_spin.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SETTINGS = [("default threads, default wait policy", {}),
            ("default threads, OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}),
            ("default threads, GOMP_SPINCOUNT=100000", {"GOMP_SPINCOUNT": "100000"}),
            ("OMP_NUM_THREADS=1", {"OMP_NUM_THREADS": "1"})]
CALLS, GAP_S = 500, 0.002


def child() -> None:
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                              torch.nn.ReLU(), torch.nn.Linear(1024, 10)).eval()
    x = torch.randn(32, 256)
    with torch.inference_mode():
        for _ in range(50):
            net(x)
        wall0, cpu0, busy = time.perf_counter(), time.process_time(), 0.0
        for _ in range(CALLS):
            start = time.perf_counter()
            net(x)
            busy += time.perf_counter() - start
            time.sleep(GAP_S)
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
    print(torch.get_num_threads(), 1000 * cpu / CALLS, 1000 * busy / CALLS, cpu / wall)


def main() -> None:
    if sys.argv[1:] == ["--child"]:
        child()
        return
    print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}, {os.cpu_count()} CPUs\n")
    print("| setting | torch threads | CPU per call ms | forward wall ms | cores busy |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, env in SETTINGS:
        out = subprocess.run([sys.executable, __file__, "--child"], env={**os.environ, **env}, check=True,
                             capture_output=True, text=True).stdout.split()
        threads, cpu, forward, share = int(out[0]), float(out[1]), float(out[2]), float(out[3])
        print(f"| {name} | {threads} | {cpu:.2f} | {forward:.2f} | {share:.2f} |", flush=True)


if __name__ == "__main__":
    main()
