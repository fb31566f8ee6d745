"""A replica's command line, as the node agent (or a zygote, for the replicas it forks) writes it."""

from __future__ import annotations

import argparse
import functools


def parse(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


@functools.cache
def parser() -> argparse.ArgumentParser:
    """Built once per process: a zygote builds it before it forks, so that its replicas only parse."""
    p = argparse.ArgumentParser(prog="ember_runtime.replica")
    p.add_argument("--nats", required=True)
    p.add_argument("--bundle", required=True, help="unpacked bundle folder")
    p.add_argument("--module", required=True)
    p.add_argument("--app", required=True)
    p.add_argument("--service", required=True)
    p.add_argument("--version", type=int, required=True)
    p.add_argument("--replica-id", required=True)
    p.add_argument("--node-id", required=True)
    p.add_argument("--restarts", type=int, default=0)
    p.add_argument("--restart-reason", default="", help="why the previous process of this replica ended")
    p.add_argument("--start-kind", choices=["cold", "artifact", "zygote", "warm"], default="cold")
    p.add_argument("--exit-with", type=int, default=0, metavar="PID",
                   help="drain and exit when process PID (the node agent) exits; for replicas forked from a zygote")
    p.add_argument("--decided-at", type=float, default=None, help="when the agent decided to start it (epoch s)")
    p.add_argument("--fetch-s", type=float, default=0.0, help="seconds the agent spent fetching the bundle")
    p.add_argument("--startup-timeout-s", type=float, default=0.0, help="the import and setup at most; 0: no limit")
    return p
