"""A process whose model thread was never shut down (its replica ended before its clean-up: its NATS connection
refused, say) still exits: the interpreter tells the thread to stop, as it does concurrent.futures' workers."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
from ember_runtime.batching.modelthread import ModelThread
thread = ModelThread()
assert thread.submit(lambda: 41 + 1).result() == 42
raise SystemExit(3)
"""


def test_an_idle_model_thread_does_not_hold_the_process_at_exit():
    ended = subprocess.run([sys.executable, "-c", SCRIPT], timeout=60, capture_output=True, text=True)
    assert ended.returncode == 3, ended.stderr
