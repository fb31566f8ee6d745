"""``ember ls`` and ``ember delete``."""

from __future__ import annotations

import argparse

import msgspec

from ember._client import default_transport
from ember.cli.output import table
from ember.cli.rollout import traffic
from ember.wire import AppView


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("ls", help="list deployed apps, their functions and replicas")
    p.set_defaults(run=run_ls)
    d = sub.add_parser("delete", help="delete an app and stop its replicas")
    d.add_argument("app")
    d.set_defaults(run=run_delete)


def run_ls(_args: argparse.Namespace) -> int:
    views = msgspec.json.decode(default_transport().request("GET", "/v1/apps").content, type=list[AppView])
    rows = []
    for view in views:
        serving = {v.version for v in view.versions if v.percent} or {view.version}
        for svc in view.services:
            current = [r for r in svc.replicas if r.version in serving | {view.version}]
            ready = sum(r.state == "ready" for r in current if r.version == view.version)
            states = ",".join(sorted({r.state for r in current} - {"ready"})) or "-"
            for fn in svc.functions:
                rows.append((f"{view.app}.{fn}", f"v{view.version}", traffic(view), f"{ready}/{svc.min_replicas}",
                             states, sum(r.calls for r in current)))
    if not rows:
        print("no apps deployed; try `ember push examples/hello/hello.py`")
        return 0
    print(table(["FUNCTION", "VERSION", "TRAFFIC", "READY/MIN", "OTHER STATES", "CALLS"], rows))
    return 0


def run_delete(args: argparse.Namespace) -> int:
    default_transport().request("DELETE", f"/v1/apps/{args.app}")
    print(f"deleted {args.app}")
    return 0
