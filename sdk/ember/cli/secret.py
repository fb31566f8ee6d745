"""``ember secret set|ls|rm``: environment variables for the functions that declare them (admin)."""

from __future__ import annotations

import argparse
import time

from ember._secrets import list_secrets, parse_values, remove_secret, set_secret
from ember.cli.output import table


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("secret", help="set, list and remove secrets (needs an admin token)")
    verbs = p.add_subparsers(dest="secret_command", required=True, metavar="VERB")
    s = verbs.add_parser("set", help="create or replace a secret: all its keys at once, and the apps that may use it",
                         description="KEY=VALUE puts the value on the command line (and in shell history); "
                                     "KEY=@path reads it from a file, KEY=- from standard input. --apps is required: "
                                     "only the apps it matches may declare the secret.")
    s.add_argument("name", metavar="NAME")
    s.add_argument("--apps", action="append", required=True, metavar="PATTERN[,PATTERN]",
                   help="app names or globs whose functions may use it ('team-b-*'; '*' for every app); "
                        "repeat or comma-separate for more")
    s.add_argument("pairs", nargs="+", metavar="KEY=VALUE")
    s.set_defaults(run=run_set)
    ls = verbs.add_parser("ls", help="list the secrets: names, keys and the apps that may use them, never values")
    ls.set_defaults(run=run_ls)
    rm = verbs.add_parser("rm", help="remove a secret")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(run=run_rm)


def run_set(args: argparse.Namespace) -> int:
    apps = [p.strip() for given in args.apps for p in given.split(",") if p.strip()]
    view = set_secret(args.name, parse_values(args.pairs), apps)
    print(f"secret {view.name}: {', '.join(view.keys)}; for apps {', '.join(view.apps)}")
    return 0


def run_ls(_args: argparse.Namespace) -> int:
    rows = [(v.name, ", ".join(v.keys), ", ".join(v.apps) or "none (set it again with --apps)",
             time.strftime("%Y-%m-%d %H:%M", time.localtime(v.updated_at))) for v in list_secrets()]
    print(table(["NAME", "KEYS", "APPS", "UPDATED"], rows) if rows else "no secrets")
    return 0


def run_rm(args: argparse.Namespace) -> int:
    remove_secret(args.name)
    print(f"removed secret {args.name}")
    return 0
