"""The control plane, once it serves, hides what its start made from the cyclic collector and collects its youngest
generation less often (``settle_gc``): a call allocates a few hundred objects, almost none in cycles."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def test_settle_gc_freezes_the_start_and_raises_the_thresholds() -> None:
    code = textwrap.dedent("""
        import gc, json
        from ember_platform.__main__ import GC_THRESHOLDS, settle_gc
        before = (gc.get_threshold(), gc.get_freeze_count())
        settle_gc()
        print(json.dumps({"before": before, "after": [gc.get_threshold(), gc.get_freeze_count()],
                          "wanted": GC_THRESHOLDS}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == [[700, 10, 10], 0]  # Python's defaults, nothing frozen
    (thresholds, frozen), wanted = seen["after"], seen["wanted"]
    assert thresholds == wanted and thresholds[0] > 700 and frozen > 10_000  # the imported platform is frozen
