"""``GET /metrics`` in multiprocess mode declares each family once: the multiprocess collector yields every family
counted in the folder (the LLM and schedule ones among them), which their own registries would add again, and
Prometheus's and OpenMetrics' parsers reject a family declared twice."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

from support.paths import REPO

SCRAPE = """
import types
from ember_platform.control.schedules import ScheduleMetrics
from ember_platform.metrics import scrape
from ember_platform.metrics.calls import CallMetrics
from ember_platform.metrics.llm import LlmMetrics, LlmTimer


class NoState:  # the control plane's state needs a live control plane: none here
    def __init__(self, platform, sees):
        pass

    def collect(self):
        return iter(())


scrape.StateCollector = NoState
platform = types.SimpleNamespace(call_metrics=CallMetrics(), llm_metrics=LlmMetrics(),
                                 schedules=types.SimpleNamespace(metrics=ScheduleMetrics()))
platform.call_metrics.record("one", "greet", 1, 200, 0.01)
timer = LlmTimer(platform.llm_metrics, "my-model", "one")
timer.first()
timer.piece()
timer.piece()
timer.done()
platform.schedules.metrics.runs.labels("one", "fired").inc()
print(scrape.render(platform, lambda app: True).decode())
"""


def test_each_family_is_declared_once_in_multiprocess_mode(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", SCRAPE], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    declared = collections.Counter(line.split()[2] for line in lines if line.startswith("# TYPE"))
    assert declared and max(declared.values()) == 1, {name: n for name, n in declared.items() if n > 1}
    assert {"vllm:generation_tokens_total", "ember_schedule_runs_total", "ember_requests_total"} <= set(declared)
    generated = [line for line in lines if line.startswith("vllm:generation_tokens_total{")]
    assert len(generated) == 1 and generated[0].endswith(" 2.0"), generated
