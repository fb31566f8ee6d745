"""Python's cyclic garbage collector in a long-running Ember process (the control plane, a replica, a zygote).

A serving process allocates a few hundred objects per call, almost none in reference cycles, beside a large heap
made once while it started: imported modules, a model and the framework under it (about 170,000 tracked objects
once torch and a small MLP are loaded), the platform's mirrors of its buckets. Each full collection scans all of
it: 39 ms for torch and the MLP on the machine of bench/RESULTS.md, a pause that falls on whatever call is running.
``settle`` collects once, at the end of the start, and freezes what is left (``gc.freeze``: those objects are still
freed when nothing refers to them, but the collector never scans them again).
"""

from __future__ import annotations

import gc


def settle(thresholds: tuple[int, int, int] | None = None) -> None:
    """Collect the start's garbage, then freeze what survives; with ``thresholds``, collect less often from now on
    (``gc.set_threshold``).

    It does not count what it froze: ``gc.get_freeze_count`` walks every frozen object (15 ms for torch's heap),
    which would lengthen each replica's start, a zygote's fork included, by as much."""
    gc.collect()
    gc.freeze()
    if thresholds is not None:
        gc.set_threshold(*thresholds)
