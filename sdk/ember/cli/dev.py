"""``ember dev [app.py]``: run the embedded platform here until Ctrl-C, which drains and stops it."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from ember.cli.push import print_endpoints, push_app
from ember.dev.embedded import EmbeddedPlatform


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("dev", help="run nats-server, the control plane and a node agent on this machine")
    p.add_argument("app_file", nargs="?", help="an app to push once the platform is up")
    p.add_argument("--port", type=int, default=8700, help="HTTP port of the control plane (0: any free port)")
    p.add_argument("--state-dir", type=Path, default=Path(".ember/dev"))
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    platform = EmbeddedPlatform(args.state_dir, http_port=args.port)
    try:
        platform.start()
        os.environ["EMBER_URL"] = platform.url
        os.environ["EMBER_TOKEN"] = platform.token
        print(f"Ember is running at {platform.url} (NATS {platform.nats_url}); logs in {platform.log_dir}",
              flush=True)
        if args.app_file:
            print_endpoints(push_app(args.app_file))
        print(f"export EMBER_URL={platform.url}   # for other shells; Ctrl-C stops Ember", flush=True)
        print(f"export EMBER_TOKEN={platform.token}   # an admin token, also in {platform.state_dir / 'token'}",
              flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        print("draining and stopping...", flush=True)
    finally:
        platform.stop()
    print("stopped", flush=True)
    return 0


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt
