"""``ember quota set|ls|rm``: limits per app pattern or token (admin)."""

from __future__ import annotations

import argparse

from ember._quotas import list_quotas, parse_memory_mb, parse_rate, remove_quota, set_quota
from ember.cli.output import table
from ember.wire import Quota, QuotaRequest


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("quota", help="set, list and remove quotas on apps or tokens (needs an admin token)")
    verbs = p.add_subparsers(dest="quota_command", required=True, metavar="VERB")
    s = verbs.add_parser("set", help="create or replace a quota")
    s.add_argument("name", metavar="NAME")
    subject = s.add_mutually_exclusive_group(required=True)
    subject.add_argument("--apps", metavar="PATTERN", help="the apps it covers, together: a name or glob ('team-a-*')")
    subject.add_argument("--token", metavar="ID", help="the calls made with this token (`ember token ls`)")
    s.add_argument("--replicas", type=int, metavar="N", help="at most N replicas (apps only)")
    s.add_argument("--gpu-memory", metavar="SIZE", help="at most this much GPU memory, e.g. 80GB (apps only)")
    s.add_argument("--concurrency", type=int, metavar="N", help="at most N calls in flight (per control plane)")
    s.add_argument("--rate", metavar="R", help="calls per second, minute or hour: 50/s, 600/m (per control plane)")
    s.add_argument("--burst", type=int, metavar="N", help="calls allowed at once above the rate (default: 1 s worth)")
    s.set_defaults(run=run_set)
    ls = verbs.add_parser("ls", help="list the quotas and what they use now")
    ls.set_defaults(run=run_ls)
    rm = verbs.add_parser("rm", help="remove a quota")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(run=run_rm)


def run_set(args: argparse.Namespace) -> int:
    request = QuotaRequest(
        apps=args.apps, token=args.token, max_replicas=args.replicas,
        max_gpu_memory_mb=parse_memory_mb(args.gpu_memory) if args.gpu_memory is not None else None,
        max_concurrent_calls=args.concurrency, rate_per_s=parse_rate(args.rate) if args.rate is not None else None,
        burst=args.burst)
    quota = set_quota(args.name, request)
    print(f"quota {quota.name}: {_subject(quota)}: {_limits(quota)}")
    return 0


def run_ls(_args: argparse.Namespace) -> int:
    rows = []
    for view in list_quotas():
        q, u = view.quota, view.usage
        rows.append((q.name, _subject(q), _of(u.replicas, q.max_replicas),
                     _of(f"{u.gpu_memory_mb / 1024:.1f}", None if q.max_gpu_memory_mb is None
                         else f"{q.max_gpu_memory_mb / 1024:.1f}", " GiB"),
                     _of(u.calls_in_flight, q.max_concurrent_calls),
                     "-" if q.rate_per_s is None else f"{q.rate_per_s:g}/s (burst {q.burst})"))
    print(table(["NAME", "SUBJECT", "REPLICAS", "GPU MEMORY", "CALLS IN FLIGHT", "RATE"], rows) if rows
          else "no quotas")
    return 0


def run_rm(args: argparse.Namespace) -> int:
    quota = remove_quota(args.name)
    print(f"removed quota {quota.name} ({_subject(quota)})")
    return 0


def _subject(q: Quota) -> str:
    return f"apps {q.apps}" if q.apps is not None else f"token {q.token}"


def _limits(q: Quota) -> str:
    parts = [f"replicas <= {q.max_replicas}"] if q.max_replicas is not None else []
    parts += [f"GPU memory <= {q.max_gpu_memory_mb} MB"] if q.max_gpu_memory_mb is not None else []
    parts += [f"calls in flight <= {q.max_concurrent_calls}"] if q.max_concurrent_calls is not None else []
    parts += [f"{q.rate_per_s:g} calls/s, burst {q.burst}"] if q.rate_per_s is not None else []
    return ", ".join(parts)


def _of(used: object, limit: object, unit: str = "") -> str:
    return f"{used}{unit}" if limit is None else f"{used}/{limit}{unit}"
