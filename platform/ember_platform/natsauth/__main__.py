"""``python -m ember_platform.natsauth``: set up NATS auth for a deployment.

    init DIR                    make the keys (once) and DIR/auth.conf, which every nats-server includes
    node-creds DIR NODE OUT     write the credentials file of node agent NODE (mode 0600) to OUT

No secret is printed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ember.wire.natscreds import write_file
from ember_platform.natsauth import keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ember_platform.natsauth", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("init", help="make the keys and the servers' auth.conf")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("node-creds", help="write a node agent's credentials file")
    p.add_argument("dir", type=Path)
    p.add_argument("node_id")
    p.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "init":
        keys.init(args.dir)
        print(f"NATS auth keys in {args.dir}; every nats-server includes {args.dir / keys.SERVER_CONF_FILE}")
        return 0
    try:
        creds = keys.load(args.dir).node_credentials(args.node_id)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_file(args.out, creds)
    print(f"wrote the credentials of node {args.node_id} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
