"""``ember events publish SUBJECT --data ...``: publish an event over HTTP (a token with the ``events`` scope)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ember._errors import InvalidInputError
from ember._events import publish_event


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("events", help="publish events to the subjects your apps' functions are bound to")
    verbs = p.add_subparsers(dest="events_command", required=True, metavar="VERB")
    pub = verbs.add_parser("publish", help="publish one event: the function bound to SUBJECT runs on it",
                           description="The data is sent as is (JSON, or any bytes). A token with the events scope "
                                       "may publish to the subjects bound (on=) by its apps' functions.")
    pub.add_argument("subject", metavar="SUBJECT")
    pub.add_argument("--data", required=True, metavar="DATA",
                     help="the event's data; @path reads it from a file, - from standard input")
    pub.add_argument("--id", default=None, metavar="KEY",
                     help="an idempotency key (the message's Nats-Msg-Id): a retried publish runs once")
    pub.set_defaults(run=run_publish)


def run_publish(args: argparse.Namespace) -> int:
    answer = publish_event(args.subject, _data(args.data), idempotency_key=args.id)
    again = " (a duplicate: stored before)" if answer.get("duplicate") else ""
    print(f"published to {answer['subject']}: stream {answer['stream']}, sequence {answer['seq']}{again}")
    return 0


def _data(given: str) -> bytes:
    if given == "-":
        return sys.stdin.buffer.read()
    if given.startswith("@"):
        try:
            return Path(given[1:]).read_bytes()
        except OSError as exc:
            raise InvalidInputError(f"--data {given[:80]!r}: {exc.strerror or exc}", field="--data") from None
    return given.encode()
