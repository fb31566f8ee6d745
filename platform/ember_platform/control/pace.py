"""The control loop's pace: a tick every ``TICK_S``, and one soon after a deployment changes (a push, a scale, a
rollback, a promote), so that the replicas it asks for are placed then rather than at the next period."""

from __future__ import annotations

import asyncio
import contextlib

TICK_S = 0.5
WOKEN_TICK_GAP_S = 0.02  # a tick woken by a change waits this long first: what comes with it (a push writes more)


async def until_next_tick(changed: asyncio.Event) -> None:
    """Return after ``TICK_S``, or ``WOKEN_TICK_GAP_S`` after ``changed`` is set, whichever comes first; clear it.
    A change during the tick that follows wakes the one after it: none is missed, none waits a period."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(changed.wait(), TICK_S)
        await asyncio.sleep(WOKEN_TICK_GAP_S)
    changed.clear()
