"""Several gateway processes, one set of counters: with PROMETHEUS_MULTIPROC_DIR, each process writes its counts to
files in that folder and a scrape from any of them sums them all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.paths import REPO

COUNT = """
import sys
from ember_platform.metrics.calls import CallMetrics
metrics = CallMetrics()
for _ in range(int(sys.argv[1])):
    metrics.record("a", "f", 1, 200, 0.004)
"""
READ = """
import json
from prometheus_client import generate_latest
from ember_platform.metrics.calls import CallMetrics
metrics = CallMetrics()
print(json.dumps({"calls": metrics.totals()[("a", "f")].calls,
                  "text": generate_latest(metrics.registry()).decode()}))
"""


def _python(code: str, *args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_counts_of_several_processes_are_summed(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    _python(COUNT, "3", env=env)
    _python(COUNT, "4", env=env)
    scraped = json.loads(_python(READ, env=env))
    assert scraped["calls"] == 7
    assert 'ember_requests_total{app="a",code="200",function="f",version="1"} 7.0' in scraped["text"]
    assert any(p.name.startswith("counter_") for p in tmp_path.iterdir())


def test_without_the_folder_each_process_counts_alone(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    _python(COUNT, "3", env=env)
    assert "ember_requests_total{" not in json.loads(_python(READ.replace('metrics.totals()[("a", "f")].calls',
                                                                          "0"), env=env))["text"]
