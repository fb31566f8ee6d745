"""``ember dev [app.py]``: run the embedded platform here until Ctrl-C, which drains and stops it."""

from __future__ import annotations

import argparse
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path

from ember._client import default_transport
from ember._deploy import app_view
from ember._errors import EmberError
from ember.cli.push import print_endpoints, push_app
from ember.cli.rollout import traffic
from ember.dev.embedded import EmbeddedPlatform, PortInUseError
from ember.dev.watch import changes
from ember.wire import AppView

GRPC_PORT = 8701


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("dev", help="run nats-server, the control plane and a node agent on this machine")
    p.add_argument("app_file", nargs="?", help="an app to push once the platform is up")
    p.add_argument("--port", type=int, default=8700, help="HTTP port of the control plane (0: any free port)")
    p.add_argument("--grpc-port", type=int, default=None,
                   help="gRPC port of the control plane, the Open Inference Protocol's (0: any free port; default "
                        f"{GRPC_PORT}, or any free port with --port 0)")
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
    # Ctrl-C stops Ember even where this process was started with SIGINT ignored (a shell's background job, a
    # runner that ignores it): Python then leaves it ignored, and nothing would stop it but SIGKILL
    signal.signal(signal.SIGINT, signal.default_int_handler)
    grpc_port = args.grpc_port if args.grpc_port is not None else (GRPC_PORT if args.port else 0)
    platform = EmbeddedPlatform(args.state_dir, http_port=args.port, grpc_port=grpc_port)
    try:
        platform.start()
        os.environ["EMBER_URL"] = platform.url
        os.environ["EMBER_TOKEN"] = platform.token
        print(f"Ember is running at {platform.url} (NATS {platform.nats_url}); logs in {platform.log_dir}",
              flush=True)
        print(f"Open Inference Protocol over gRPC at {platform.grpc_address} (tritonclient.grpc)", flush=True)
        for note in platform.isolation_notes():
            print(f"WARNING: {note}", flush=True)
        if args.app_file:
            _first_push(args.app_file, args.watch)
        print(f"export EMBER_URL={platform.url}   # for other shells; Ctrl-C stops Ember", flush=True)
        print(f"export EMBER_TOKEN={platform.token}   # an admin token, also in {platform.state_dir / 'token'}",
              flush=True)
        if args.watch:
            _watch(Path(args.app_file))
        while True:
            signal.pause()
    except PortInUseError as exc:  # raised before anything started
        print(f"ember dev: {exc}; choose another with {exc.flag}, as in `ember dev {exc.flag} {exc.port + 1}` "
              f"({exc.flag} 0: any free port)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("draining and stopping...", flush=True)
    finally:
        platform.stop()
    print("stopped", flush=True)
    return 0


def _first_push(app_file: str, watch: bool) -> None:
    """Push the app once the platform is up. Whatever the push meets (an import that fails, a build that fails, a
    setup that raises, a newer version pushed from another shell while this one starts) is shown, and Ember keeps
    running: the platform is the developer's until Ctrl-C, not the first push's."""
    views: list[AppView] = []
    try:
        print_endpoints(push_app(app_file, seen=views.append))
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # shown, never fatal: the platform keeps serving
        print(f"push failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        newer = _newer_version(views[-1]) if views else None
        if newer is not None:
            print(f"{newer.app} v{newer.version} was pushed meanwhile; it is the app's version now "
                  f"(traffic: {traffic(newer)})", flush=True)
        again = "save the app to push it again" if watch else f"push it again with `ember push {app_file}`"
        print(f"Ember keeps running: {again}; Ctrl-C stops Ember", flush=True)


def _newer_version(pushed: AppView) -> AppView | None:
    """The app's view when a version newer than ``pushed`` took its place (a push from another shell), else None."""
    try:
        view = app_view(default_transport(), pushed.app)
    except EmberError:  # only a hint: no view, no hint
        return None
    return view if view.version > pushed.version else None


def _watch(app_file: Path) -> None:
    """Push a new version each time the app's folder settles after a change, until Ctrl-C. A push that fails
    (a syntax error, a setup that raises) is shown; the version before keeps serving. While a pushed version starts,
    a new change is pushed at once (it replaces the one still starting)."""
    root = app_file.resolve().parent
    print(f"watching {root} for changes (Ctrl-C stops)", flush=True)
    bursts: queue.Queue[list[str]] = queue.Queue()
    stop = threading.Event()

    def watch() -> None:
        for paths in changes(root, stop):
            bursts.put(paths)

    watcher = threading.Thread(target=watch, name="ember-watch", daemon=True)
    watcher.start()
    try:
        while True:
            paths = _next_burst(bursts)
            shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
            print(f"changed: {shown}; pushing", flush=True)
            try:
                view = push_app(str(app_file), wait=False)
            except EmberError as exc:
                print(f"push failed, the version before keeps serving: {type(exc).__name__}: {exc}",
                      file=sys.stderr, flush=True)
                continue
            _follow(view, bursts)
    finally:
        stop.set()
        watcher.join(2)


def _next_burst(bursts: queue.Queue[list[str]]) -> list[str]:
    """The next burst of changes, merged with any that queued up behind it."""
    while True:
        try:
            paths = set(bursts.get(timeout=0.5))  # a timeout: Ctrl-C is seen at once
            break
        except queue.Empty:
            continue
    while not bursts.empty():
        paths.update(bursts.get_nowait())
    return sorted(paths)


def _follow(pushed: AppView, bursts: queue.Queue[list[str]]) -> None:
    """Say when the pushed version takes the calls, or why it cannot start; stop following at the next change."""
    transport = default_transport()
    while bursts.empty():
        view = app_view(transport, pushed.app)
        if view.version != pushed.version:
            return
        own = next((v for v in view.versions if v.version == view.version), None)
        if own is None or own.state in ("serving", "canary"):
            print(f"{view.app} v{view.version} serves ({traffic(view)})", flush=True)
            return
        mine = [r for s in view.services for r in s.replicas if r.version == view.version]
        if mine and all(r.state == "failed" for r in mine):
            why = next((r.message for r in mine if r.message), "its replicas failed")
            print(f"v{view.version} cannot start, the version before keeps serving: {why}", file=sys.stderr,
                  flush=True)
            return
        time.sleep(0.2)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt
