"""Schedules: a function's ``ember.Period`` or ``ember.Cron`` as the manifest carries it, the arithmetic of its ticks
(pure: the clock is an argument), and the state the control plane keeps of each scheduled function.

A period's ticks are the multiples of its length since the epoch (UTC), so every control plane computes the same
ticks and a new version keeps them. A cron expression's ticks are computed by ``cronsim`` in the schedule's IANA
zone, with its daylight-saving rules as Debian's cron follows them: an expression with a fixed minute and hour runs a
time skipped when the clocks go forward once, at the first minute that exists, and a time that happens twice when
they go back once; one with ``*`` in its minute or hour field follows the clock (each real hour of ``@hourly`` once;
the times of a skipped hour do not exist, and do not run).
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

Overlap = Literal["skip", "queue", "allow"]
CatchUp = Literal["latest", "none", "all"]
MAX_CATCH_UP = 100  # catch_up="all": at most this many missed ticks run, the most recent ones
ON_TIME_S = 10.0  # catch_up="none": a tick handled within this long after its time still runs (not a missed one);
# more than a control plane's takeover after the lease holder died (its lease's 6 s, then a pass), so that a
# failover alone misses no tick
MIN_PERIOD_S, MAX_PERIOD_S = 1.0, 366 * 86400.0
HOST_ZONES = frozenset({"localtime", "posixrules", "Factory"})
NAMED = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
         "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}


class ScheduleSpec(msgspec.Struct, frozen=True, kw_only=True):
    """When a function runs by itself: every ``period_s`` seconds, or at the times ``cron`` names in ``timezone``."""

    period_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_PERIOD_S)] = 0.0
    cron: Annotated[str, msgspec.Meta(max_length=256)] = ""
    timezone: Annotated[str, msgspec.Meta(max_length=64)] = "UTC"
    overlap: Overlap = "skip"
    catch_up: CatchUp = "latest"


class ScheduleState(msgspec.Struct, frozen=True, kw_only=True):
    """What the control plane keeps of one scheduled function (KV ``ember_schedules``, key ``<app>.<function>``)."""

    last_tick: float = 0.0  # the most recent tick handled (fired, skipped or missed); 0: none yet
    last_call_id: str = ""  # the call of the last tick that ran (or of the last run asked for)
    tick_call_id: str = ""  # the call of the last tick that ran: a run asked for since does not hide it from overlap
    last_status: str = ""  # "fired", "skipped" (the previous run still ran), "missed" (catch_up), "paused", "run"
    last_run_at: float = 0.0  # when that call was queued
    paused: bool = False
    runs: int = 0
    queued: tuple[float, ...] = ()  # overlap="queue": ticks waiting for the run before them, oldest first
    born_at: float = 0.0  # its app's ``Deployment.born_at``: a state kept of an app of the name deleted before is not
    # this one's (0: written before it was kept, or by an app first pushed before)
    timing: str = ""  # ``timing(spec)`` of the schedule its last tick was handled by ("": not known)

    def of(self, dep_born_at: float) -> ScheduleState:
        """This state as the app born at ``dep_born_at`` sees it: a fresh one if it was another app's. Where either
        is not known (0: written by an older control plane) it is kept, as before apps were told apart."""
        if not self.born_at or not dep_born_at or self.born_at == dep_born_at:
            return self
        return ScheduleState(born_at=dep_born_at)


Name = Annotated[str, msgspec.Meta(min_length=1, max_length=257)]
Text = Annotated[str, msgspec.Meta(max_length=512)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]


class ScheduleView(msgspec.Struct, frozen=True, kw_only=True):
    """One scheduled function, as ``GET /v1/schedules`` and ``ember schedules`` show it."""

    app: Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
    function: Name
    schedule: Text  # in words ("every 5 minutes", "cron '0 6 * * 1-5' (Europe/Paris)")
    spec: ScheduleSpec
    paused: bool = False
    next_run: Seconds = 0.0  # the next tick (seconds since the epoch; 0 while paused)
    last_tick: Seconds = 0.0  # the last tick handled (0: none yet)
    last_status: Text = ""  # what became of it: fired, skipped, missed, paused, run (a run asked for)
    last_call_id: Annotated[str, msgspec.Meta(max_length=512)] = ""
    last_call_status: Text = ""  # that call's status now (queued, running, succeeded, ...; "" when unknown)
    runs: Annotated[int, msgspec.Meta(ge=0)] = 0


class ScheduleRun(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/apps/<app>/schedules/<fn>/run``: the call queued now, outside the schedule."""

    app: Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
    function: Name
    call_id: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


def state_key(app: str, function: str) -> str:
    """The key of ``app``'s ``function`` in ``ember_schedules``: the app is its first token."""
    return f"{app}.{function}"


def problem(spec: ScheduleSpec) -> tuple[str, str] | None:
    """(field, what is wrong) for a schedule that cannot tick; None when it can."""
    if (spec.period_s > 0) == bool(spec.cron):
        return "period_s", "a schedule is a period or a cron expression, exactly one of them"
    if spec.period_s and not MIN_PERIOD_S <= spec.period_s <= MAX_PERIOD_S:
        return "period_s", f"a period is {MIN_PERIOD_S:g} s to 366 days"
    zone = _zone(spec.timezone)
    if zone is None:
        return "timezone", f"{spec.timezone[:64]!r} is not an IANA time zone (such as 'UTC' or 'Europe/Paris')"
    if spec.cron:
        from cronsim import CronSim, CronSimError

        if len(expand(spec.cron).split()) != 5:
            return "cron", f"{spec.cron[:80]!r} is not a 5-field cron expression (minute hour day month weekday)"
        try:
            CronSim(expand(spec.cron), datetime(2000, 1, 1, tzinfo=zone))
        except (CronSimError, ValueError) as exc:
            return "cron", f"{spec.cron[:80]!r} is not a 5-field cron expression: {exc}"
    return None


def _zone(name: str) -> ZoneInfo | None:
    """The IANA zone ``name``, or None: not one, or one whose rules depend on the host (``localtime``, ``posixrules``,
    the ``posix/`` and ``right/`` trees: two control planes would tick at different times)."""
    if name != name.strip() or name in HOST_ZONES or name.startswith(("posix/", "right/")):
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):  # OSError: a folder of zones ("Europe")
        return None


def expand(expr: str) -> str:
    """``@hourly``-style names as the 5 fields they stand for."""
    return NAMED.get(expr.strip().lower(), expr.strip())


def timing(spec: ScheduleSpec) -> str:
    """What decides when ``spec`` ticks (not what a tick does): a state handled by another timing does not catch
    up under this one."""
    return f"{spec.period_s!r}|{expand(spec.cron)}|{spec.timezone}"


def ticks_between(spec: ScheduleSpec, after: float, upto: float, limit: int = MAX_CATCH_UP + 1) -> list[float]:
    """The ticks in (``after``, ``upto``], oldest first; only the most recent ``limit`` of them (a cron's are
    found from ``upto`` back, so a month of minutes missed costs as much as ``limit`` of them)."""
    if spec.period_s:
        first, last = _multiple(after, spec.period_s) + 1, _multiple(upto, spec.period_s)
        return [n * spec.period_s for n in range(max(first, last - limit + 1), last + 1)]
    ticks: list[float] = []
    tick = next_tick(spec, max(after, _back(spec, upto, limit) - 1.0))
    while tick <= upto:
        ticks.append(tick)
        if len(ticks) > limit:
            ticks.pop(0)
        tick = next_tick(spec, tick)
    return ticks


def _multiple(t: float, period_s: float) -> int:
    """The last multiple of ``period_s`` at or before ``t``: ``n`` with ``n * period_s <= t < (n + 1) * period_s``,
    as the ticks' own products compare (a division alone may round a tick itself down to the one before)."""
    n = math.floor(t / period_s)
    while (n + 1) * period_s <= t:
        n += 1
    while n * period_s > t:
        n -= 1
    return n


def _back(spec: ScheduleSpec, upto: float, count: int) -> float:
    """About the ``count``-th most recent of a cron's ticks at or before ``upto`` (walked back by cronsim: where the
    clocks change this may be an hour off, which only moves the oldest of ``count`` ticks); 0 if there are fewer."""
    from cronsim import CronSim

    start = datetime.fromtimestamp(math.floor(upto) + 1, tz=UTC).astimezone(ZoneInfo(spec.timezone))
    found = 0.0
    for n, when in enumerate(CronSim(expand(spec.cron), start, reverse=True)):
        found = when.timestamp()
        if n + 1 >= count:
            return found
    return 0.0


def next_tick(spec: ScheduleSpec, after: float) -> float:
    """The first tick strictly after ``after`` (seconds since the epoch)."""
    if spec.period_s:
        return (_multiple(after, spec.period_s) + 1) * spec.period_s
    from cronsim import CronSim

    zone = ZoneInfo(spec.timezone)
    start = datetime.fromtimestamp(math.floor(after), tz=UTC).astimezone(zone)
    # In the hour a fall-back repeats, the next wall-clock match may be its first pass, before ``after``.
    return next(t for t in (when.timestamp() for when in CronSim(expand(spec.cron), start)) if t > after)


def due(spec: ScheduleSpec, state: ScheduleState, now: float) -> tuple[list[float], int]:
    """The ticks to run now, oldest first, and how many were missed (not run, by ``catch_up``). A schedule seen for
    the first time runs from its next tick on."""
    if not state.last_tick or now <= state.last_tick:  # a clock behind the one that handled the last tick
        return [], 0
    ticks = ticks_between(spec, state.last_tick, now)
    total = len(ticks)  # a cron's count stops at the limit; a period's is exact
    if spec.period_s:
        total = _multiple(now, spec.period_s) - _multiple(state.last_tick, spec.period_s)
    if spec.catch_up == "none":  # even a single tick, when it is handled late (the control planes were down)
        on_time = [t for t in ticks[-1:] if now - t < ON_TIME_S]
        return on_time, total - len(on_time)
    if total <= 1:
        return ticks, 0
    if spec.catch_up == "all":
        kept = ticks[-MAX_CATCH_UP:]
        return kept, total - len(kept)
    return ticks[-1:], total - 1  # "latest"


def tick_call_id(app: str, function: str, tick: float) -> str:
    """The call id of ``function``'s run for ``tick``: the same on every control plane (as a spawned call's)."""
    return f"{app}_{hashlib.sha256(f'{app}.{function}.{tick_ms(tick)}'.encode()).hexdigest()[:32]}"


def tick_msg_id(app: str, function: str, tick: float) -> str:
    """Its ``Nats-Msg-Id``: JetStream stores the tick's message once within the stream's duplicate window."""
    return f"{app}.{function}.{tick_ms(tick)}"


def tick_ms(tick: float) -> int:
    return round(tick * 1000)


def describe(spec: ScheduleSpec) -> str:
    """The schedule in words, as ``ember schedules`` shows it."""
    if spec.period_s:
        seconds = spec.period_s
        for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
            if seconds >= size and seconds % size == 0:
                n = int(seconds // size)
                return f"every {n} {unit}{'s' if n > 1 else ''}"
        return f"every {seconds:g} seconds"
    return f"cron {spec.cron!r} ({spec.timezone})"
