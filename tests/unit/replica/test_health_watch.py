"""The replica's watch of a class model's ``@ember.health`` check (``ember_runtime.replica.health``), on a real event
loop and real threads: it gives way once, with why, after as many failed checks in a row (False, raised or hung) as
the check allows; a passing check starts the count again."""

from __future__ import annotations

import asyncio
import threading

import ember
from ember_runtime.replica import health


def _verdict(check: object, stop_after_s: float | None = None, failures: int = 1) -> list[str]:
    """What ``health.watch`` gives way with for an instance whose check is ``check`` (a 0.1 s period)."""
    said: list[str] = []

    class Model:
        @ember.health(every_s=0.1, timeout_s=0.3, failures=failures)
        def check(self) -> object:
            return check()  # type: ignore[operator]

    async def run() -> None:
        stopping = asyncio.Event()

        async def give_way(why: str) -> None:
            said.append(why)

        if stop_after_s is not None:
            asyncio.get_running_loop().call_later(stop_after_s, stopping.set)
        await asyncio.wait_for(health.watch(Model(), stopping, give_way), 10)

    asyncio.run(run())
    return said


def test_the_health_watch_gives_way_once_on_the_first_failed_check_where_one_is_allowed() -> None:
    calls = []

    def flaky() -> bool:
        calls.append(1)
        return len(calls) < 3  # two good checks, then False

    assert _verdict(flaky) == ["its health check check() returned False: this replica is being replaced"]
    assert len(calls) == 3

    def raises() -> None:
        raise OSError("no device")

    assert _verdict(raises) == ["its health check check() raised OSError: no device: this replica is being replaced"]
    hold = threading.Event()
    try:
        assert _verdict(hold.wait) == ["its health check check() did not return within 0.3 s: this replica is being "
                                       "replaced"]
    finally:
        hold.set()
    assert _verdict(lambda: None, stop_after_s=0.5) == []  # None is healthy; the watch ends with the replica


def test_by_default_three_failed_checks_in_a_row_make_it_give_way_and_a_pass_starts_the_count_again() -> None:
    results = iter([False, False, True, False, False, True, False, False, False, True])
    calls = []

    def blinking() -> bool:
        calls.append(1)
        return next(results)

    assert _verdict(blinking, failures=3) == [
        "its health check check() returned False (3 checks in a row): this replica is being replaced"]
    assert len(calls) == 9  # two blips of two failures each were forgiven


def test_a_watch_stopped_between_failures_gives_no_way() -> None:
    assert _verdict(lambda: False, stop_after_s=0.25, failures=5) == []
