"""A warm replica's standby: its version left the app's traffic, and a control plane keeps it for a quick rollback.

While told so (``subjects.replica_standby``, each control-loop tick) the replica pulls nothing from its functions'
shared queues and event streams: those calls belong to the versions that serve. Synchronous calls never reach it
(the gateways route none to a version out of the traffic) and its own pinned queue stays open (calls pinned to
it). Standby is a lease: once nobody repeats it, the replica pulls again, as it does when rolled back to.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ember.wire import subjects

HOLD_S = 3.0  # a standby not repeated within this long is over (a control plane repeats it twice a second)
RECHECK_S = 0.25  # how often a paused worker looks again


class Standby:
    """Whether this replica is on standby now; ``on_message`` is the subscription's callback."""

    def __init__(self) -> None:
        self._until = 0.0

    @property
    def held(self) -> bool:
        return time.monotonic() < self._until

    async def on_message(self, msg: Any) -> None:
        self._until = time.monotonic() + HOLD_S if msg.data == subjects.STANDBY else 0.0

    async def wait_over(self, stop: asyncio.Event) -> None:
        """Return once the standby is over (or ``stop`` is set)."""
        while self.held and not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), RECHECK_S)
            except TimeoutError:
                continue
