"""``ember subject grant|revoke|ls``: the subject patterns apps may bind beyond their own ``events.<app>.>``
(admin)."""

from __future__ import annotations

import argparse

from ember._subjects import grant_subject, list_subject_grants, revoke_subject
from ember.cli.output import table


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("subject", help="grant apps event subjects beyond their own events.<app>.> (needs an admin "
                                       "token)")
    verbs = p.add_subparsers(dest="subject_command", required=True, metavar="VERB")
    g = verbs.add_parser("grant", help="let apps bind subjects inside a pattern, from their next push")
    g.add_argument("pattern", metavar="PATTERN", help="a NATS subject pattern, e.g. 'orders.>' (quote it)")
    g.add_argument("--apps", required=True, metavar="P[,P]", help="app names or globs ('ingest-*')")
    g.set_defaults(run=run_grant)
    r = verbs.add_parser("revoke", help="take a pattern back, at the apps' next push")
    r.add_argument("pattern", metavar="PATTERN")
    r.add_argument("--apps", metavar="P[,P]", help="only from these app patterns (default: from every app)")
    r.set_defaults(run=run_revoke)
    ls = verbs.add_parser("ls", help="list the grants")
    ls.set_defaults(run=run_ls)


def _apps(raw: str | None) -> list[str]:
    return [p.strip() for p in (raw or "").split(",") if p.strip()]


def run_grant(args: argparse.Namespace) -> int:
    grant = grant_subject(args.pattern, _apps(args.apps))
    print(f"{grant.pattern}: apps {', '.join(grant.apps)} may bind it (at their next push)")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    left = revoke_subject(args.pattern, _apps(args.apps))
    print(f"{args.pattern}: " + (f"still granted to {', '.join(left.apps)}" if left else "granted to no app"))
    return 0


def run_ls(_args: argparse.Namespace) -> int:
    rows = [(g.pattern, ", ".join(g.apps), g.updated_by or "-") for g in list_subject_grants()]
    print(table(["PATTERN", "APPS", "BY"], rows) if rows else "no subject grants (each app binds events.<app>.> alone)")
    return 0
