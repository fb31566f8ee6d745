"""The event loop Ember's own processes run on: uvloop where it is installed, asyncio's otherwise.

uvloop roughly halves the CPU the gateway and the replicas spend per call in the event loop itself
(socket reads and writes, timers, wake-ups from the model thread); nothing in Ember depends on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the fastest loop available."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
