"""``ember calls``: spawned calls (``get``, ``cancel``) and dead letters (``dead``, ``replay``)."""

from __future__ import annotations

import argparse
import sys
import time

import msgspec

from ember._function_call import FunctionCall
from ember._handles import lookup
from ember.cli.output import split_target, table
from ember.wire import DeadLetter, encoder

_ERROR_WIDTH = 60


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("calls", help="inspect and cancel spawned calls; list and replay dead letters")
    verbs = p.add_subparsers(dest="calls_command", required=True, metavar="VERB")
    g = verbs.add_parser("get", help="print a call's record (status, output or error) as JSON")
    g.add_argument("call_id", metavar="ID")
    g.add_argument("--wait", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds for the call to finish (at most 300)")
    g.set_defaults(run=run_get)
    c = verbs.add_parser("cancel", help="cancel a queued or running call")
    c.add_argument("call_id", metavar="ID")
    c.add_argument("--terminate", action="store_true",
                   help="also stop and replace the replica running it (for sync code that never checks "
                        "ember.current_call().cancelled); its other calls are retried elsewhere")
    c.set_defaults(run=run_cancel)
    d = verbs.add_parser("dead", help="list a function's dead letters")
    d.add_argument("target", metavar="APP.FUNCTION")
    d.set_defaults(run=run_dead)
    r = verbs.add_parser("replay", help="resubmit a function's dead letters and print the new call ids")
    r.add_argument("target", metavar="APP.FUNCTION")
    r.add_argument("--id", dest="call_ids", action="append", metavar="ID",
                   help="replay only this dead letter (repeatable); default: all of them")
    r.set_defaults(run=run_replay)


def run_get(args: argparse.Namespace) -> int:
    record = FunctionCall.from_id(args.call_id).record(wait_s=args.wait)
    print(msgspec.json.format(encoder.encode(record), indent=2).decode())
    return 0


def run_cancel(args: argparse.Namespace) -> int:
    call = FunctionCall.from_id(args.call_id)
    if call.cancel(terminate=args.terminate):
        print(f"cancelled {args.call_id}")
        return 0
    print(f"ember: call {args.call_id} is {call.status()} already; only a queued or running call can be cancelled",
          file=sys.stderr)
    return 1


def run_dead(args: argparse.Namespace) -> int:
    app, fn = split_target(args.target)
    letters = lookup(app, fn).dead_letters()
    if not letters:
        print(f"no dead letters for {app}.{fn}")
        return 0
    print(table(["CALL ID", "ATTEMPTS", "ERROR", "DEAD AT"], [_row(letter) for letter in letters]))
    return 0


def run_replay(args: argparse.Namespace) -> int:
    app, fn = split_target(args.target)
    calls = lookup(app, fn).replay(args.call_ids)
    print(f"replayed {len(calls)} dead letter(s) of {app}.{fn} as new calls:", file=sys.stderr)
    for call in calls:
        print(call.call_id)
    return 0


def _row(letter: DeadLetter) -> tuple[str, int, str, str]:
    error = f"{letter.error.type or letter.error.code}: {letter.error.message}"
    error = " ".join(error.split())
    if len(error) > _ERROR_WIDTH:
        error = error[:_ERROR_WIDTH - 3] + "..."
    dead_at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(letter.dead_at))
    return letter.call_id, letter.attempts, error, dead_at
