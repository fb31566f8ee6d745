"""``ember._gc.settle``: the start's garbage is collected (never frozen for good), what survives is frozen, and the
thresholds are set when given. Each case runs in a fresh interpreter: freezing is process-wide."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_starts_garbage_is_collected_and_what_survives_is_frozen() -> None:
    seen = _run("""
        import gc, json, weakref
        from ember import _gc

        class Big:
            pass

        kept = Big()
        garbage = Big()
        garbage.me = garbage  # a cycle nothing refers to: what a setup may leave behind
        gone = weakref.ref(garbage)
        del garbage
        gc.disable()  # so that only settle() may collect it
        _gc.settle()
        print(json.dumps({"count": gc.get_freeze_count(), "garbage_left": gone() is not None,
                          "kept_tracked": gc.is_tracked(kept), "thresholds": gc.get_threshold()}))
    """)
    assert seen["garbage_left"] is False  # collected first, not frozen with the rest
    assert seen["count"] > 1000 and seen["kept_tracked"] is True
    assert seen["thresholds"] == [700, 10, 10]  # Python's, unless asked


def test_thresholds_are_set_when_given() -> None:
    seen = _run("""
        import gc, json
        from ember import _gc
        _gc.settle((5000, 20, 30))
        print(json.dumps({"thresholds": gc.get_threshold()}))
    """)
    assert seen["thresholds"] == [5000, 20, 30]
