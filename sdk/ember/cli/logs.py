"""``ember logs APP.FN``: recent output of a function's replicas (``-f`` to follow)."""

from __future__ import annotations

import argparse
import time

import msgspec

from ember._client import default_transport
from ember.cli.output import split_target
from ember.wire import LogLine


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("logs", help="show the logs of an app's or a function's replicas")
    p.add_argument("target", metavar="APP[.FUNCTION]")
    p.add_argument("--follow", "-f", action="store_true")
    p.add_argument("--lines", "-n", type=int, default=200)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    app, _, fn = args.target.partition(".")
    if fn:
        app, fn = split_target(args.target)
    service = fn.split(".")[0] if fn else ""
    since = 0.0
    while True:
        lines = fetch(app, service, since, args.lines)
        for line in lines:
            stamp = time.strftime("%H:%M:%S", time.localtime(line.ts))
            print(f"{stamp} {line.replica_id} {line.line}", flush=True)
            since = max(since, line.ts)
        if not args.follow:
            return 0
        time.sleep(0.5)


def fetch(app: str, service: str, since: float, limit: int) -> list[LogLine]:
    params: dict[str, str | float | int] = {"since": since, "limit": limit}
    if service:
        params["service"] = service
    response = default_transport().request("GET", f"/v1/apps/{app}/logs", params=params)
    return msgspec.json.decode(response.content, type=list[LogLine])
