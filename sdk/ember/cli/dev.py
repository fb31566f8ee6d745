"""``ember dev [app.py]``: run the embedded platform here until Ctrl-C, which drains and stops it."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from ember._errors import EmberError
from ember.cli.push import print_endpoints, push_app
from ember.cli.rollout import traffic
from ember.dev.embedded import EmbeddedPlatform
from ember.dev.watch import changes


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("dev", help="run nats-server, the control plane and a node agent on this machine")
    p.add_argument("app_file", nargs="?", help="an app to push once the platform is up")
    p.add_argument("--port", type=int, default=8700, help="HTTP port of the control plane (0: any free port)")
    p.add_argument("--state-dir", type=Path, default=Path(".ember/dev"))
    p.add_argument("--watch", action="store_true",
                   help="push a new version (a rollout: the one before serves until it is ready) whenever the app "
                        "file or another file in its folder changes")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.watch and not args.app_file:
        print("ember dev: --watch needs the app file to watch", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    platform = EmbeddedPlatform(args.state_dir, http_port=args.port)
    try:
        platform.start()
        os.environ["EMBER_URL"] = platform.url
        os.environ["EMBER_TOKEN"] = platform.token
        print(f"Ember is running at {platform.url} (NATS {platform.nats_url}); logs in {platform.log_dir}",
              flush=True)
        if args.app_file:
            _first_push(args.app_file, args.watch)
        print(f"export EMBER_URL={platform.url}   # for other shells; Ctrl-C stops Ember", flush=True)
        print(f"export EMBER_TOKEN={platform.token}   # an admin token, also in {platform.state_dir / 'token'}",
              flush=True)
        if args.watch:
            _watch(Path(args.app_file))
        while True:
            signal.pause()
    except KeyboardInterrupt:
        print("draining and stopping...", flush=True)
    finally:
        platform.stop()
    print("stopped", flush=True)
    return 0


def _first_push(app_file: str, watch: bool) -> None:
    """Push the app; when watching, a failure (a syntax error, say) is shown and the next save tries again."""
    try:
        print_endpoints(push_app(app_file))
    except EmberError as exc:
        if not watch:
            raise
        print(f"push failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _watch(app_file: Path) -> None:
    """Push a new version each time the app's folder settles after a change, until Ctrl-C. A push that fails
    (a syntax error, a setup that raises) is shown; the version before keeps serving."""
    root = app_file.resolve().parent
    print(f"watching {root} for changes (Ctrl-C stops)", flush=True)
    for paths in changes(root, threading.Event()):
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        print(f"changed: {shown}; pushing", flush=True)
        try:
            view = push_app(str(app_file))
        except EmberError as exc:
            print(f"push failed, the version before keeps serving: {type(exc).__name__}: {exc}", file=sys.stderr,
                  flush=True)
            continue
        print(f"{view.app} v{view.version} serves ({traffic(view)})", flush=True)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt
