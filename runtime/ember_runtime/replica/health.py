"""A class model's ``@ember.health`` check, run while its replica serves: every period, on a thread of its own (a
daemon: a check that never returns neither holds the model thread nor keeps the process from leaving). A check that
raises, returns False or outlives its timeout fails; the check's ``failures`` in a row make the replica give way
(``Replica._give_way``), and the watch ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from ember._setup import health_check

log = logging.getLogger("ember.replica")


async def watch(instance: Any, stopping: asyncio.Event, give_way: Callable[[str], Awaitable[None]]) -> None:
    """Check ``instance`` (a class model's, set up; None: nothing to check) until ``stopping`` is set or its checks
    failed as many times in a row as it allows, then ``give_way(why)`` (the last failure's)."""
    found = health_check(type(instance)) if instance is not None else None
    if found is None:
        return
    name, every_s, timeout_s, allowed = found
    check = getattr(instance, name)
    failed = 0
    while not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), every_s)
            return
        why = await _run(check, timeout_s)
        failed = failed + 1 if why else 0
        if why and failed < allowed:
            log.warning("its health check %s() %s (%d of %d failures in a row before it gives way)", name, why,
                        failed, allowed)
        elif why and not stopping.is_set():
            in_a_row = f" ({failed} checks in a row)" if failed > 1 else ""
            await give_way(f"its health check {name}() {why}{in_a_row}: this replica is being replaced")
            return


async def _run(check: Callable[[], Any], timeout_s: float) -> str:
    """Run ``check`` once on a thread of its own: "" when it passed, else what went wrong."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str] = loop.create_future()

    def settle(outcome: str) -> None:
        if not done.done():
            done.set_result(outcome)

    def run() -> None:
        try:
            outcome = "returned False" if check() is False else ""
        except Exception as exc:
            outcome = f"raised {type(exc).__name__}: {exc}"
        with contextlib.suppress(RuntimeError):  # the loop closed while a late check ran
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=run, name="ember-health", daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(done), timeout_s)
    except TimeoutError:
        return f"did not return within {timeout_s:g} s"
