"""The event loop Ember's own processes run on: uvloop where it is installed, asyncio's otherwise.

uvloop roughly halves the CPU the gateway and the replicas spend per call in the event loop itself
(socket reads and writes, timers, wake-ups from the model thread); nothing in Ember depends on it.
``cancel_and_wait`` stops the background tasks of a component that stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
RECANCEL_S = 2.0  # a task still running this long after its cancellation is cancelled again (its cleanup had time)


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


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` and wait until each has ended, cancelling again any that goes on. One cancellation can be
    lost: Python 3.11's ``asyncio.wait_for`` (nats-py's requests and connects wait in it) returns its inner result
    when that and the cancellation come in the same turn, and a loop that takes the result, or the error, and carries
    on would be waited for for ever (a control plane's stop once hung so). Their exceptions are retrieved."""
    waited = [t for t in tasks if t is not None]
    pending = {t for t in waited if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    await asyncio.gather(*waited, return_exceptions=True)
