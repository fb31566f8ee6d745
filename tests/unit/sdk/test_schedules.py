"""The arithmetic of schedules with a fake clock (the times are arguments): DST days in two zones, leap years, steps,
month ends, catch_up; and what ``ember.Period``/``ember.Cron`` and the manifest's checks refuse."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

import ember
from ember.wire import FunctionSpec, Manifest, ServiceSpec
from ember.wire.schedules import (
    MAX_CATCH_UP,
    ScheduleSpec,
    ScheduleState,
    describe,
    due,
    next_tick,
    problem,
    tick_call_id,
    tick_msg_id,
    ticks_between,
)
from ember.wire.validate import manifest_problems


def _at(zone: str, *parts: int) -> float:
    return datetime(*parts, tzinfo=ZoneInfo(zone)).timestamp()


def _local(zone: str, ts: float) -> str:
    return datetime.fromtimestamp(ts, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M %z")


def _cron(expr: str, zone: str = "UTC", **kw: str) -> ScheduleSpec:
    return ember.Cron(expr, timezone=zone, **kw).spec  # type: ignore[arg-type]


def test_a_skipped_time_runs_once_at_the_first_minute_that_exists_and_a_repeated_one_once() -> None:
    paris = _cron("30 2 * * *", "Europe/Paris")
    spring = ticks_between(paris, _at("Europe/Paris", 2025, 3, 29, 12), _at("Europe/Paris", 2025, 3, 31, 12))
    assert [_local("Europe/Paris", t) for t in spring] == ["2025-03-30 03:00 +0200", "2025-03-31 02:30 +0200"]
    autumn = ticks_between(paris, _at("Europe/Paris", 2025, 10, 25, 12), _at("Europe/Paris", 2025, 10, 27, 12))
    assert [_local("Europe/Paris", t) for t in autumn] == ["2025-10-26 02:30 +0200", "2025-10-27 02:30 +0100"]
    york = _cron("30 2 * * *", "America/New_York")  # another zone, other dates
    spring = ticks_between(york, _at("America/New_York", 2025, 3, 8, 12), _at("America/New_York", 2025, 3, 10, 12))
    assert [_local("America/New_York", t) for t in spring] == ["2025-03-09 03:00 -0400", "2025-03-10 02:30 -0400"]
    hourly = _cron("@hourly", "America/New_York")  # the repeated hour: each real hour once
    day = ticks_between(hourly, _at("America/New_York", 2025, 11, 2, 0), _at("America/New_York", 2025, 11, 2, 4))
    assert len(day) == 5 and all(b - a == 3600 for a, b in itertools.pairwise(day))


def test_the_next_tick_in_a_repeated_hour_is_after_it() -> None:
    """Handled in the second pass of a fall-back's hour, 02:50 is the next day's: the first 02:50 is past."""
    paris = _cron("50 2 * * *", "Europe/Paris")
    second_half_past_two = datetime(2025, 10, 26, 2, 30, fold=1, tzinfo=ZoneInfo("Europe/Paris")).timestamp()
    tick = next_tick(paris, second_half_past_two)
    assert tick > second_half_past_two and _local("Europe/Paris", tick) == "2025-10-27 02:50 +0100"


def test_a_clock_behind_the_last_tick_finds_nothing_due() -> None:
    """A control plane whose clock is behind the one that handled the last tick: nothing due, nothing missed (a
    negative count of missed ticks made every pass raise)."""
    for spec in (ScheduleSpec(period_s=60, catch_up="none"), _cron("* * * * *", "UTC")):
        assert due(spec, ScheduleState(last_tick=10_000.0), now=10_000.0 - 600) == ([], 0)


def test_a_step_in_the_hour_skipped_follows_the_clock() -> None:
    """``*`` in the minute field: no Debian fix-up. 02:00-02:59 does not exist on 2025-03-09 in New York, so neither
    do 02:00, 02:20 and 02:40: that day has no tick, and the days around it three each (as the guide says)."""
    steps = _cron("*/20 2 * * *", "America/New_York")
    ticks = ticks_between(steps, _at("America/New_York", 2025, 3, 8, 0), _at("America/New_York", 2025, 3, 10, 12))
    assert [_local("America/New_York", t) for t in ticks] == [
        "2025-03-08 02:00 -0500", "2025-03-08 02:20 -0500", "2025-03-08 02:40 -0500",
        "2025-03-10 02:00 -0400", "2025-03-10 02:20 -0400", "2025-03-10 02:40 -0400"]


def test_leap_years_month_ends_and_steps() -> None:
    feb29 = _cron("0 0 29 2 *")
    assert _local("UTC", next_tick(feb29, _at("UTC", 2025, 3, 1))) == "2028-02-29 00:00 +0000"
    month_end = _cron("0 12 31 * *")  # only the months that have a 31st
    ends = ticks_between(month_end, _at("UTC", 2025, 1, 1), _at("UTC", 2025, 7, 1))
    assert [_local("UTC", t)[:10] for t in ends] == ["2025-01-31", "2025-03-31", "2025-05-31"]
    sevens = _cron("*/7 * * * *")  # 0, 7, ..., 56, then 0 again: the step restarts each hour
    minutes = [datetime.fromtimestamp(t, UTC).minute
               for t in ticks_between(sevens, _at("UTC", 2025, 1, 1, 0), _at("UTC", 2025, 1, 1, 1, 10))]
    assert minutes == [7, 14, 21, 28, 35, 42, 49, 56, 0, 7]
    weekdays = _cron("0 6 * * 1-5", "Europe/Paris")
    week = ticks_between(weekdays, _at("Europe/Paris", 2025, 6, 1), _at("Europe/Paris", 2025, 6, 8))
    assert [datetime.fromtimestamp(t, ZoneInfo("Europe/Paris")).isoweekday() for t in week] == [1, 2, 3, 4, 5]


def test_periods_tick_on_multiples_since_the_epoch() -> None:
    five = ember.Period(minutes=5).spec
    assert five.period_s == 300
    assert next_tick(five, 1_000_000.0) == 1_000_200.0
    assert ticks_between(five, 1_000_000.0, 1_001_000.0) == [1_000_200.0, 1_000_500.0, 1_000_800.0]
    assert describe(five) == "every 5 minutes" and describe(ember.Period(seconds=1).spec) == "every 1 seconds"


@pytest.mark.parametrize(("catch_up", "run", "missed"), [("latest", [1_000_009.0], 8), ("none", [1_000_009.0], 8),
                                                         ("all", [float(t) for t in range(1_000_001, 1_000_010)], 0)])
def test_catch_up_after_downtime(catch_up: str, run: list[float], missed: int) -> None:
    spec = ember.Period(seconds=1, catch_up=catch_up).spec  # type: ignore[arg-type]
    assert due(spec, ScheduleState(last_tick=1_000_000.0), 1_000_009.5) == (run, missed)
    assert due(spec, ScheduleState(), 1_000_009.5) == ([], 0)  # first seen: from its next tick on
    assert due(spec, ScheduleState(last_tick=1_000_009.0), 1_000_009.5) == ([], 0)


def test_catch_up_none_skips_a_latest_tick_long_past_and_all_keeps_the_last_hundred() -> None:
    hourly = _cron("@hourly", catch_up="none")
    start = _at("UTC", 2025, 1, 1)
    assert due(hourly, ScheduleState(last_tick=start), start + 5 * 3600 + 600) == ([], 5)
    every = ember.Period(seconds=1, catch_up="all").spec
    run, missed = due(every, ScheduleState(last_tick=0.5), 1000.0)
    assert len(run) == 100 and run[-1] == 1000.0 and missed == 900


def test_catch_up_none_runs_a_tick_only_within_a_few_seconds_of_its_time() -> None:
    """A failover (the lease's 6 s, then a pass) is within the window: a tick due then still runs."""
    spec = ember.Period(seconds=30, catch_up="none").spec
    assert due(spec, ScheduleState(last_tick=1_000_020.0), 1_000_052.0) == ([1_000_050.0], 0)  # 2 s late: on time
    assert due(spec, ScheduleState(last_tick=1_000_020.0), 1_000_058.0) == ([1_000_050.0], 0)  # 8 s: a failover
    assert due(spec, ScheduleState(last_tick=1_000_020.0), 1_000_066.0) == ([], 1)  # 16 s late: missed
    assert due(spec, ScheduleState(last_tick=1_000_020.0), 1_000_058.0 - 30) == ([], 0)  # nothing due yet
    latest = ember.Period(seconds=30, catch_up="latest").spec
    assert due(latest, ScheduleState(last_tick=1_000_020.0), 1_000_066.0) == ([1_000_050.0], 0)


def test_a_fractional_periods_tick_is_never_handled_twice_or_counted_missed() -> None:
    """Each tick is a product ``n * period``; a division alone floored some of them to ``n - 1`` (one in seven of
    periods such as 3617.76 s): the tick handled came back, or counted as missed."""
    spec = ember.Period(seconds=3617.76).spec
    for n in range(1, 3000):
        tick = n * spec.period_s
        assert next_tick(spec, tick) == (n + 1) * spec.period_s
        assert due(spec, ScheduleState(last_tick=tick), tick + 1.0) == ([], 0)


@pytest.mark.parametrize("zone", ["Europe/Paris", "America/New_York", "Australia/Lord_Howe"])
def test_a_month_of_missed_minutes_gives_the_last_hundred_as_walking_them_all_does(zone: str) -> None:
    """A cron's ticks are found from the end back (a month of minutes walked one by one took 0.7 s of the control
    loop, per schedule); the result is the walk's, across the clocks' changes too."""
    for spec in (_cron("* * * * *", zone), _cron("30 2 * * *", zone), _cron("0 * * * *", zone)):
        for end in (_at(zone, 2024, 3, 31, 4, 0), _at(zone, 2024, 11, 3, 2, 30), _at(zone, 2024, 10, 6, 3, 0)):
            for gap in (50.0, 7200.0, 3 * 86400.0, 40 * 86400.0):
                walked, tick = [], next_tick(spec, end - gap)
                while tick <= end and len(walked) < 100_000:
                    walked.append(tick)
                    tick = next_tick(spec, tick)
                assert ticks_between(spec, end - gap, end) == walked[-(MAX_CATCH_UP + 1):], (spec.cron, end, gap)


@pytest.mark.parametrize("zone", ["Europe", "America", "localtime", "posixrules", "posix/Europe/Paris",
                                  "right/UTC", " UTC", "Factory"])
def test_a_folder_of_zones_or_a_hosts_own_zone_is_refused_by_name(zone: str) -> None:
    """``Europe`` raised IsADirectoryError (a 500 at push); ``localtime`` is each host's own zone: two control
    planes would tick at different times."""
    assert problem(ScheduleSpec(cron="0 6 * * *", timezone=zone)) == (
        "timezone", f"{zone!r} is not an IANA time zone (such as 'UTC' or 'Europe/Paris')")
    with pytest.raises(ember.InvalidSpecError):
        ember.Cron("0 6 * * *", timezone=zone)


def test_a_cron_of_six_fields_is_refused() -> None:
    """cronsim reads a sixth field as seconds (every 5 s); the documentation says five fields."""
    found = problem(ScheduleSpec(cron="*/5 * * * * *"))
    assert found is not None and found[0] == "cron" and "5-field" in found[1]


def test_a_tick_has_the_same_ids_everywhere() -> None:
    assert tick_msg_id("app", "Cls.fn", 1_000_000.0) == "app.Cls.fn.1000000000"
    call_id = tick_call_id("app", "fn", 1.0)
    assert call_id == tick_call_id("app", "fn", 1.0) != tick_call_id("app", "fn", 2.0)
    assert call_id.startswith("app_") and len(call_id) == 4 + 32


@pytest.mark.parametrize("make", [
    lambda: ember.Cron("61 * * * *"), lambda: ember.Cron("* * *"), lambda: ember.Cron("@often"),
    lambda: ember.Cron("0 0 * * *", timezone="Mars/Olympus"), lambda: ember.Cron("0 0 * * *", overlap="never"),
    lambda: ember.Period(), lambda: ember.Period(seconds=0.5), lambda: ember.Period(days=400),
    lambda: ember.Period(minutes=1, catch_up="some"),
])
def test_bad_schedules_are_refused_at_once(make) -> None:
    with pytest.raises(ember.InvalidSpecError):
        make()


def test_the_manifest_check_names_the_field() -> None:
    def manifest(schedule: ScheduleSpec) -> Manifest:
        fn = FunctionSpec(name="tick", attr="tick", input_mode="args", schedule=schedule)
        return Manifest(app="sched", module="m", services=[ServiceSpec(name="tick", kind="function", functions=[fn])])

    problems = dict(manifest_problems(manifest(ScheduleSpec(cron="0 0 * *"))))
    assert "$.manifest.services[0].functions[0].schedule.cron" in problems
    problems = dict(manifest_problems(manifest(ScheduleSpec(cron="@daily", timezone="Nowhere/City"))))
    assert "$.manifest.services[0].functions[0].schedule.timezone" in problems
    problems = dict(manifest_problems(manifest(ScheduleSpec(period_s=0.1))))
    assert "$.manifest.services[0].functions[0].schedule.period_s" in problems
    assert not list(manifest_problems(manifest(ember.Cron("0 6 * * 1-5", timezone="Europe/Paris").spec)))
