"""``ember scale APP.FN --min N --max M``: change a function's replica bounds at run time."""

from __future__ import annotations

import argparse

import msgspec

from ember._client import default_transport
from ember.cli.output import split_target
from ember.wire import ScaleRequest, ServiceStatus, encoder


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("scale", help="set a function's minimum and maximum replicas (overrides its decorator)")
    p.add_argument("target", metavar="APP.FUNCTION", help="a class model's methods scale together: APP.Class")
    p.add_argument("--min", dest="min_replicas", type=int, required=True, metavar="N", help="replicas kept warm")
    p.add_argument("--max", dest="max_replicas", type=int, required=True, metavar="M", help="at most this many")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    app, fn = split_target(args.target)
    body = ScaleRequest(service=fn.split(".")[0], min_replicas=args.min_replicas, max_replicas=args.max_replicas)
    response = default_transport().request("POST", f"/v1/apps/{app}/scale", content=encoder.encode(body),
                                           headers={"content-type": "application/json"})
    status = msgspec.json.decode(response.content, type=ServiceStatus)
    print(f"{status.app}.{status.service}: min {status.min_replicas}, max {status.max_replicas} "
          f"({status.ready} ready now)")
    return 0
