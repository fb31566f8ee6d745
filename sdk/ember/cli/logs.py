"""``ember logs APP[.FN]``: output of an app's or a function's replicas; ``-f`` follows it as the platform pushes it
(one streamed request, not polling)."""

from __future__ import annotations

import argparse
import re
import sys
import time

import msgspec

from ember._client import default_transport
from ember._errors import BadRequestError
from ember.cli.output import split_target
from ember.wire import LogLine

_line_decoder = msgspec.json.Decoder(LogLine)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("logs", help="show the logs of an app's or a function's replicas")
    p.add_argument("target", metavar="APP[.FUNCTION]")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing lines as they come")
    p.add_argument("--lines", "-n", type=int, default=200, help="at most this many of the kept lines (default 200)")
    p.add_argument("--replica", help="only this replica's lines")
    p.add_argument("--stream", choices=["stdout", "stderr", "agent"], help="only this stream")
    p.add_argument("--since", help="lines after this: a duration ago (30s, 10m, 2h, 1d) or a Unix timestamp")
    p.add_argument("--until", help="lines up to this: a duration ago or a Unix timestamp")
    p.add_argument("--json", action="store_true", help="print each line as its JSON record")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    app, _, fn = args.target.partition(".")
    if fn:
        app, fn = split_target(args.target)
    params: dict[str, str | float | int] = {"limit": args.lines}
    if fn:
        params["service"] = fn.split(".")[0]
    for name in ("replica", "stream"):
        if getattr(args, name):
            params[name] = getattr(args, name)
    now = time.time()
    for name in ("since", "until"):
        if getattr(args, name):
            params[name] = moment(getattr(args, name), now, name)
    path = f"/v1/apps/{app}/logs"
    if not args.follow:
        response = default_transport().request("GET", path, params=params)
        for line in msgspec.json.decode(response.content, type=list[LogLine]):
            show(line, args.json)
        return 0
    params["follow"] = "true"
    import httpx

    try:
        with default_transport().stream("GET", path, params=params, headers={"accept": "application/x-ndjson"},
                                        timeout=httpx.Timeout(None, connect=5.0)) as response:
            for raw in response.iter_lines():
                if raw and not follow_event(raw, args.json):
                    return 1
    except KeyboardInterrupt:
        return 0
    return 0


def follow_event(raw: str, as_json: bool) -> bool:
    """Print one event of a followed stream; False when it is the stream's final error."""
    if raw.startswith('{"event"'):
        event = msgspec.json.decode(raw)
        if event.get("event") == "dropped":
            print(f"... {event['dropped']} lines dropped (this terminal fell behind)", file=sys.stderr, flush=True)
            return True
        message = (event.get("error") or {}).get("message", raw)
        print(f"ember: the platform ended the stream: {message}", file=sys.stderr, flush=True)
        return False
    show(_line_decoder.decode(raw), as_json)
    return True


def show(line: LogLine, as_json: bool) -> None:
    if as_json:
        print(msgspec.json.encode(line).decode(), flush=True)
        return
    stamp = time.strftime("%H:%M:%S", time.localtime(line.ts))
    print(f"{stamp} {line.replica_id} {line.line}", flush=True)


def moment(text: str, now: float, name: str) -> float:
    """A time given on the command line: ``30s``/``10m``/``2h``/``1d`` ago, or a Unix timestamp."""
    if match := _DURATION.match(text.strip()):
        return now - float(match[1]) * _UNIT_S[match[2]]
    try:
        stamp = float(text)
    except ValueError:
        stamp = -1.0
    if not 0 <= stamp < 1e11:
        raise BadRequestError(f"--{name} {text!r}: a duration (30s, 10m, 2h, 1d) or a Unix timestamp", field=name)
    return stamp

