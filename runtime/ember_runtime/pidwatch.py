"""Acting once a process exits, seen by the running event loop through a pidfd (its pid may be reused after)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable


def when_exits(pid: int, then: Callable[[], None]) -> None:
    """Call ``then`` once process ``pid`` (alive when this is called: no reuse of its number) exits; at once where
    it is gone already."""
    try:
        watched = os.pidfd_open(pid)
    except OSError:
        then()
        return
    loop = asyncio.get_running_loop()

    def exited() -> None:
        loop.remove_reader(watched)
        os.close(watched)
        then()

    loop.add_reader(watched, exited)
