"""A batch that runs now, and how a cancel reaches it (``Batcher.withdraw``).

A cancelled call leaves its batch at once: it is answered ``cancelled`` and whatever the batch later returns for it
is dropped, while the batch's other calls complete. Once every call of a batch is cancelled the batch itself is
told: its ``halt`` event is set (``ember.current_call().cancelled``, which sync code may poll and a queued call's
generator checks between items) and an ``async def`` batch's task is cancelled where it awaits.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Run:
    calls: list[Any]  # the batcher's ``Call``s
    halt: threading.Event = field(default_factory=threading.Event)
    task: asyncio.Future[Any] | None = None  # an ``async def`` batch's own task

    def cancel(self, call: Any) -> None:
        call.cancelled = True
        if all(c.cancelled for c in self.calls):
            self.halt.set()
            if self.task is not None:
                self.task.cancel()


def halted(task: asyncio.Future[Any]) -> bool:
    """Whether ``task`` was cancelled by a cancel of its calls, not with the task awaiting it (shutdown)."""
    current = asyncio.current_task()
    return task.cancelled() and (current is None or current.cancelling() == 0)
