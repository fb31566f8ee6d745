"""``ember schedules [APP]``: the scheduled functions, their schedule in words, next run (here and in UTC), last
run with its status, paused or not; ``ember schedule pause|resume|run APP.FN``."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

import msgspec

from ember._client import default_transport
from ember.cli.output import split_target, table
from ember.wire.schedules import ScheduleRun, ScheduleView


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("schedules", help="list the scheduled functions: schedule, next and last run, paused")
    p.add_argument("app", nargs="?", help="only this app's")
    p.set_defaults(run=list_schedules)
    q = sub.add_parser("schedule", help="pause, resume or run now a scheduled function")
    q.add_argument("action", choices=("pause", "resume", "run"),
                   help="pause: its ticks pass unrun; resume: from its next tick; run: once now, outside the schedule")
    q.add_argument("target", metavar="APP.FUNCTION")
    q.set_defaults(run=act)


def _when(ts: float) -> str:
    """A time in this machine's zone and in UTC."""
    if not ts:
        return "-"
    local = datetime.fromtimestamp(ts).astimezone()
    utc = datetime.fromtimestamp(ts, tz=UTC)
    return f"{local:%Y-%m-%d %H:%M:%S %Z} ({utc:%H:%M:%S} UTC)"


def list_schedules(args: argparse.Namespace) -> int:
    params = {"app": args.app} if args.app else None
    response = default_transport().request("GET", "/v1/schedules", params=params)
    views = msgspec.json.decode(response.content, type=list[ScheduleView])
    if not views:
        print("no scheduled functions")
        return 0
    rows = [(f"{v.app}.{v.function}", v.schedule, "paused" if v.paused else _when(v.next_run),
             f"{_when(v.last_tick)} {v.last_status}{f' ({v.last_call_status})' if v.last_call_status else ''}"
             if v.last_tick else "-", "yes" if v.paused else "no") for v in views]
    print(table(("FUNCTION", "SCHEDULE", "NEXT RUN", "LAST RUN", "PAUSED"), rows))
    return 0


def act(args: argparse.Namespace) -> int:
    app, fn = split_target(args.target)
    response = default_transport().request("POST", f"/v1/apps/{app}/schedules/{fn}/{args.action}")
    if args.action == "run":
        run = msgspec.json.decode(response.content, type=ScheduleRun)
        print(f"{app}.{fn}: queued {run.call_id} (ember calls get {run.call_id})")
        return 0
    view = msgspec.json.decode(response.content, type=ScheduleView)
    print(f"{app}.{fn}: {'paused' if view.paused else f'resumed, next run {_when(view.next_run)}'}")
    return 0
