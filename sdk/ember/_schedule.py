"""``ember.Period`` and ``ember.Cron``: a function that runs by itself (``@app.function(schedule=...)``)."""

from __future__ import annotations

from typing import get_args

from ember._errors import InvalidSpecError
from ember.wire.schedules import CatchUp, Overlap, ScheduleSpec, problem


class Period:
    """Run every so long: ``ember.Period(minutes=5)``. Ticks fall on multiples of the period since the epoch (UTC),
    the same on every control plane and across new versions.

    Args:
        overlap: a tick whose previous run still runs: ``"skip"`` (recorded as skipped), ``"queue"`` or ``"allow"``.
        catch_up: after downtime, ``"latest"`` (the most recent missed tick runs once), ``"none"``, or ``"all"``
            (each missed tick, oldest first, at most 100).

    Example:
        >>> @app.function(schedule=ember.Period(minutes=5))
        ... def refresh() -> None: ...
    """

    def __init__(self, *, seconds: float = 0, minutes: float = 0, hours: float = 0, days: float = 0,
                 overlap: Overlap = "skip", catch_up: CatchUp = "latest") -> None:
        total = float(seconds) + 60.0 * minutes + 3600.0 * hours + 86400.0 * days
        self.spec = _checked(ScheduleSpec(period_s=total, overlap=overlap, catch_up=catch_up),
                             f"ember.Period(seconds={seconds}, minutes={minutes}, hours={hours}, days={days})")


class Cron:
    """Run at the times a 5-field cron expression names, in an IANA time zone (daylight saving followed):
    ``ember.Cron("0 6 * * 1-5", timezone="Europe/Paris")``. Ranges, steps, lists and ``@hourly``-style names.

    Example:
        >>> @app.function(schedule=ember.Cron("@daily", overlap="skip", catch_up="none"))
        ... def report() -> None: ...
    """

    def __init__(self, expr: str, *, timezone: str = "UTC", overlap: Overlap = "skip",
                 catch_up: CatchUp = "latest") -> None:
        if not isinstance(expr, str) or not isinstance(timezone, str):
            raise InvalidSpecError(f"ember.Cron({expr!r}, timezone={timezone!r}): both are strings")
        self.spec = _checked(ScheduleSpec(cron=expr, timezone=timezone, overlap=overlap, catch_up=catch_up),
                             f"ember.Cron({expr!r}, timezone={timezone!r})")


def _checked(spec: ScheduleSpec, shown: str) -> ScheduleSpec:
    if spec.overlap not in get_args(Overlap):
        raise InvalidSpecError(f"{shown}: overlap is one of {', '.join(get_args(Overlap))}, not {spec.overlap!r}")
    if spec.catch_up not in get_args(CatchUp):
        raise InvalidSpecError(f"{shown}: catch_up is one of {', '.join(get_args(CatchUp))}, not {spec.catch_up!r}")
    found = problem(spec)
    if found is not None:
        raise InvalidSpecError(f"{shown}: {found[1]}")
    return spec


def schedule_spec(where: str, schedule: object) -> ScheduleSpec | None:
    if schedule is None:
        return None
    if not isinstance(schedule, Period | Cron):
        raise InvalidSpecError(f"{where}(schedule={schedule!r}): an ember.Period(...) or ember.Cron(...)")
    return schedule.spec
