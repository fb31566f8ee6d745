"""The ``ember`` command: a thin shell over the SDK. The only place that prints or exits."""

from __future__ import annotations

import argparse
import sys

from ember._errors import EmberError
from ember.cli import (
    apps,
    call,
    calls,
    dev,
    events,
    login,
    logs,
    push,
    quota,
    rollout,
    scale,
    schedule,
    secret,
    status,
    subject,
    token,
    ui,
    volume,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ember", description="Serverless functions for ML models on GPUs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (dev, push, rollout, apps, call, calls, events, logs, status, scale, schedule, login, token, quota,
                   secret, subject, volume, ui):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # httpx imports its own command line (click, rich, pygments) wherever those are installed: 50 ms of each
    # command's start here, for nothing the ember command uses. Marked absent, it is skipped (httpx expects that).
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except EmberError as exc:
        print(f"ember: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
