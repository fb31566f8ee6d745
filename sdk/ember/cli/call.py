"""``ember call APP.FN --data '{...}'``: call a function over HTTP and print its JSON result (a generator's items,
one JSON per line, as they come).

With ``--async`` the call is queued instead, and its id printed (see ``ember calls get ID``).
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from ember._client import default_transport, spawn_op, stream_op
from ember.cli.output import split_target


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("call", help="call a deployed function and print its result")
    p.add_argument("target", metavar="APP.FUNCTION")
    p.add_argument("--data", "-d", default=None, help="the input as JSON ('-' reads stdin); default: no input")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds (capped by the function's timeout_s); with --async, counted from the submit")
    p.add_argument("--async", dest="spawn", action="store_true",
                   help="queue the call, print its id and return; `ember calls get ID` shows its result")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    app, fn = split_target(args.target)
    body = sys.stdin.buffer.read() if args.data == "-" else (args.data or "").encode()
    if args.spawn:
        print(default_transport().send(spawn_op(app, fn, body, timeout_s=args.timeout)).call_id)
        return 0
    for streamed, part in default_transport().answer_parts(stream_op(app, fn, body, timeout_s=args.timeout)):
        print(part.decode() if streamed else msgspec.json.format(part, indent=2).decode(), flush=True)
    return 0
