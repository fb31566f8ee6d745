"""``ember volume put|ls|rm``: named, versioned sets of files that functions mount read-only."""

from __future__ import annotations

import argparse
import sys
import time

from ember._volume import PutProgress, get_volume, list_volumes, put_volume, remove_volume
from ember.cli.output import table


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("volume", help="put, list and remove volumes (files that functions mount read-only)")
    verbs = p.add_subparsers(dest="volume_command", required=True, metavar="VERB")
    put = verbs.add_parser("put", help="upload files and folders as a new version of a volume",
                           description="A file goes under its own name, a folder's files under their paths inside "
                                       "it. Only chunks the platform lacks are sent: run it again after an "
                                       "interruption and it resumes.")
    put.add_argument("name", metavar="NAME")
    put.add_argument("paths", nargs="+", metavar="PATH")
    put.set_defaults(run=run_put)
    ls = verbs.add_parser("ls", help="list the volumes, or one volume's files and versions")
    ls.add_argument("name", nargs="?", metavar="NAME")
    ls.set_defaults(run=run_ls)
    rm = verbs.add_parser("rm", help="remove a volume, every version of it, and the chunks nothing else uses")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(run=run_rm)


class Bar:
    """One line on stderr, rewritten in place on a terminal (else a line every few seconds)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = time.monotonic()
        self.shown = 0.0
        self.tty = sys.stderr.isatty()

    def __call__(self, p: PutProgress) -> None:
        now = time.monotonic()
        final = p.done_bytes >= p.total_bytes
        if not final and now - self.shown < (0.1 if self.tty else 5.0):
            return
        self.shown = now
        share = p.done_bytes / p.total_bytes if p.total_bytes else 1.0
        rate = (p.done_bytes - p.skipped_bytes) / 1e6 / max(now - self.started, 1e-6)
        filled = int(share * 30)
        line = (f"{self.name} [{'#' * filled}{'.' * (30 - filled)}] {p.done_bytes / 1e6:,.1f}/"
                f"{p.total_bytes / 1e6:,.1f} MB {share:4.0%}  {rate:,.0f} MB/s sent"
                + (f", {p.skipped_bytes / 1e6:,.1f} MB already stored" if p.skipped_bytes else ""))
        print(("\r" + line) if self.tty else line, end="" if self.tty and not final else "\n", file=sys.stderr,
              flush=True)


def run_put(args: argparse.Namespace) -> int:
    view = put_volume(args.name, args.paths, progress=Bar(args.name))
    print(f"volume {view.name}: version {view.version}, {view.file_count} file(s), {view.size / 1e6:,.1f} MB")
    return 0


def run_ls(args: argparse.Namespace) -> int:
    if args.name:
        view = get_volume(args.name)
        print(f"volume {view.name}, version {view.version} (kept: {', '.join(map(str, view.versions))})"
              + (f", mounted by {', '.join(view.used_by)}" if view.used_by else ""))
        print(table(["FILE", "SIZE"], [(f.path, f"{f.size:,}") for f in view.files]))
        return 0
    rows = [(v.name, v.version, v.file_count, f"{v.size / 1e6:,.1f} MB",
             time.strftime("%Y-%m-%d %H:%M", time.localtime(v.created_at)), ", ".join(v.used_by))
            for v in list_volumes()]
    print(table(["NAME", "VERSION", "FILES", "SIZE", "CREATED", "MOUNTED BY"], rows) if rows else "no volumes")
    return 0


def run_rm(args: argparse.Namespace) -> int:
    remove_volume(args.name)
    print(f"removed volume {args.name}")
    return 0
