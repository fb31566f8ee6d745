"""``ember token create|ls|revoke``: the platform's tokens (admin)."""

from __future__ import annotations

import argparse
import sys
import time

from ember._tokens import create_token, list_tokens, revoke_token
from ember.cli.output import table
from ember.wire import TokenInfo


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("token", help="create, list and revoke the platform's tokens (needs an admin token)")
    verbs = p.add_subparsers(dest="token_command", required=True, metavar="VERB")
    c = verbs.add_parser("create", help="create a token and print it (shown this once)")
    c.add_argument("--scopes", required=True, metavar="S[,S]",
                   help="comma-separated, of admin, deploy, invoke, read, events (deploy implies read; events: "
                        "publish to the apps' bound subjects, as a plain NATS client too)")
    c.add_argument("--apps", default="*", metavar="PATTERN[,PATTERN]",
                   help="the apps it sees: names or globs, comma-separated (default: '*', every app)")
    c.add_argument("--ttl", default=None, help="how long it lives: 30d, 12h, 15m, 90s (default: until revoked)")
    c.add_argument("--name", default="", help="a name to recognise it by in `ember token ls`")
    c.set_defaults(run=run_create)
    ls = verbs.add_parser("ls", help="list the live tokens (never their secrets)")
    ls.set_defaults(run=run_ls)
    r = verbs.add_parser("revoke", help="revoke a token: it fails at its next request")
    r.add_argument("token_id", metavar="ID")
    r.set_defaults(run=run_revoke)


def run_create(args: argparse.Namespace) -> int:
    created = create_token(_split(args.scopes), _split(args.apps), name=args.name, ttl=args.ttl)
    print(f"created token {created.info.id} ({_what(created.info)}); it is shown this once:", file=sys.stderr)
    print(created.token)
    return 0


def run_ls(_args: argparse.Namespace) -> int:
    rows = [(t.id, t.name or "-", ",".join(t.scopes), ",".join(t.apps), _when(t.created_at),
             _when(t.expires_at) if t.expires_at else "never", t.created_by or "-") for t in list_tokens()]
    print(table(["ID", "NAME", "SCOPES", "APPS", "CREATED", "EXPIRES", "BY"], rows) if rows else "no tokens")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    info = revoke_token(args.token_id)
    print(f"revoked token {info.id} ({_what(info)})")
    return 0


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _what(info: TokenInfo) -> str:
    expires = f", expires {_when(info.expires_at)}" if info.expires_at else ""
    return f"{info.name + ': ' if info.name else ''}{','.join(info.scopes)} on {','.join(info.apps)}{expires}"


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts or 0))
