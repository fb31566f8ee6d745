"""``ember push app.py``: deploy an app and wait for its minimum replicas."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ember._client import platform_url
from ember._deploy import deploy
from ember.cli.output import progress_printer
from ember.cli.rollout import traffic
from ember.wire import AppView


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("push", help="package an app and deploy it to the platform at EMBER_URL")
    p.add_argument("app_file", help="the Python file that defines `app = ember.App(...)`")
    p.add_argument("--app", dest="app_name", help="which app, when the file defines several")
    p.add_argument("--no-wait", action="store_true", help="return once deployed, without waiting for replicas")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for ready replicas")
    p.add_argument("--canary", type=_percent, default=0, metavar="PERCENT",
                   help="roll the new version out as a canary taking PERCENT (1-99) of the calls, until "
                        "`ember promote` or `ember rollback`")
    p.add_argument("--relock", action="store_true",
                   help="resolve the app's images again, even those that did not change since the running version")
    p.set_defaults(run=run)


def _percent(raw: str) -> int:
    try:
        value = int(raw.rstrip("%"))
    except ValueError:
        value = -1
    if not 1 <= value <= 99:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a share of calls from 1 to 99")
    return value


def run(args: argparse.Namespace) -> int:
    view = push_app(args.app_file, app_name=args.app_name, wait=not args.no_wait, timeout_s=args.timeout,
                    canary_percent=args.canary, relock=args.relock)
    print_endpoints(view)
    return 0


def push_app(path: str, *, app_name: str | None = None, wait: bool = True, timeout_s: float = 300.0,
             canary_percent: int = 0, relock: bool = False,
             seen: Callable[[AppView], None] | None = None) -> AppView:
    """Push the app at ``path``, printing progress; ``seen`` is given each view of the app the wait sees."""
    say = progress_printer()

    def progress(message: str, view: AppView | None) -> None:
        say(message, view)
        if view is not None and seen is not None:
            seen(view)

    return deploy(path, app_name=app_name, wait=wait, timeout_s=timeout_s, progress=progress,
                  canary_percent=canary_percent, relock=relock)


def print_endpoints(view: AppView) -> None:
    url = platform_url()
    print(f"{view.app} v{view.version} is deployed" + (f" (traffic: {traffic(view)})" if view.versions else "") + ":")
    for svc in view.services:
        for fn in svc.functions:
            print(f"  POST {url}/v1/{view.app}/{fn}")
    first = view.services[0].functions[0]
    print(f"try:  curl -s -X POST {url}/v1/{view.app}/{first} -H \"Authorization: Bearer $EMBER_TOKEN\" "
          "-H 'content-type: application/json' -d '<input>'")
    print(f"      ember call {view.app}.{first} --data '<input>'")
