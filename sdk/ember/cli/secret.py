"""``ember secret set|ls|rm``: environment variables for the functions that declare them (admin)."""

from __future__ import annotations

import argparse
import time

from ember._secrets import list_secrets, parse_values, remove_secret, set_secret
from ember.cli.output import table


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("secret", help="set, list and remove secrets (needs an admin token)")
    verbs = p.add_subparsers(dest="secret_command", required=True, metavar="VERB")
    s = verbs.add_parser("set", help="create or replace a secret: all its keys at once",
                         description="KEY=VALUE puts the value on the command line (and in shell history); "
                                     "KEY=@path reads it from a file, KEY=- from standard input.")
    s.add_argument("name", metavar="NAME")
    s.add_argument("pairs", nargs="+", metavar="KEY=VALUE")
    s.set_defaults(run=run_set)
    ls = verbs.add_parser("ls", help="list the secrets: names and keys, never values")
    ls.set_defaults(run=run_ls)
    rm = verbs.add_parser("rm", help="remove a secret")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(run=run_rm)


def run_set(args: argparse.Namespace) -> int:
    view = set_secret(args.name, parse_values(args.pairs))
    print(f"secret {view.name}: {', '.join(view.keys)}")
    return 0


def run_ls(_args: argparse.Namespace) -> int:
    rows = [(v.name, ", ".join(v.keys), time.strftime("%Y-%m-%d %H:%M", time.localtime(v.updated_at)))
            for v in list_secrets()]
    print(table(["NAME", "KEYS", "UPDATED"], rows) if rows else "no secrets")
    return 0


def run_rm(args: argparse.Namespace) -> int:
    remove_secret(args.name)
    print(f"removed secret {args.name}")
    return 0
