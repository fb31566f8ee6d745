"""``ember promote APP`` and ``ember rollback APP [--to VERSION]`` (``ember push --canary`` starts a canary)."""

from __future__ import annotations

import argparse

from ember._deploy import promote, rollback
from ember.cli.output import progress_printer
from ember.wire import AppView


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("promote", help="give an app's canary all of its calls; the version before drains")
    p.add_argument("app")
    _waiting(p, "the canary takes every call")
    p.set_defaults(run=run_promote)
    r = sub.add_parser("rollback", help="serve an older version of an app again (the one before by default)")
    r.add_argument("app")
    r.add_argument("--to", type=_version, metavar="VERSION", help="the version to serve (as `ember ls` shows it)")
    _waiting(r, "that version takes every call")
    r.set_defaults(run=run_rollback)


def _waiting(parser: argparse.ArgumentParser, until: str) -> None:
    parser.add_argument("--no-wait", action="store_true", help=f"return at once, without waiting until {until}")
    parser.add_argument("--timeout", type=float, default=300.0, help=f"seconds to wait until {until}")


def _version(raw: str) -> int:
    digits = raw[1:] if raw[:1] in ("v", "V") else raw
    if not (digits.isascii() and digits.isdigit() and digits[0] != "0" and len(digits) <= 9):
        raise argparse.ArgumentTypeError(f"{raw!r} is not a version (a whole number from 1, as in 3 or v3)")
    return int(digits)


def run_promote(args: argparse.Namespace) -> int:
    view = promote(args.app, wait=not args.no_wait, timeout_s=args.timeout, progress=progress_printer())
    if args.no_wait:
        print(f"{view.app}: promoting v{view.version}; it takes all calls once it has the replicas of the version "
              f"before ({traffic(view)})")
    else:
        print(f"{view.app}: promoted v{view.version} ({traffic(view)})")
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    view = rollback(args.app, to=args.to, wait=not args.no_wait, timeout_s=args.timeout, progress=progress_printer())
    serves = any(v.version == view.version and v.percent == 100 for v in view.versions) or not view.versions
    what = "rolled back to" if serves else "rolling back to"
    print(f"{view.app}: {what} v{view.version} ({traffic(view)})")
    return 0


def traffic(view: AppView) -> str:
    """``v1 80%, v2 20% (canary), v3 rolling-out``: who takes an app's calls, and versions on their way in or out
    (or kept warm, taking no calls)."""
    parts = []
    for v in sorted(view.versions, key=lambda v: v.version):
        if v.state == "kept":
            continue
        if v.percent:
            parts.append(f"v{v.version} {v.percent}%" + (" (canary)" if v.state == "canary" else ""))
        else:
            parts.append(f"v{v.version} {'warm' if v.warm else v.state}")
    return ", ".join(parts) or f"v{view.version}"
