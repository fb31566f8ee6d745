"""The image's HEALTHCHECK: is the Ember process this container runs healthy?

One image runs either part, so this looks for the process first (``/proc``): a control plane
(``python -m ember_platform``) is healthy when its ``/healthz`` answers 200 on the port it was given; a node
agent (``python -m ember_runtime``), which serves nothing, while it runs. Exit 0: healthy; 1: not.
Standard library only; the interpreter starts, asks and exits within the check's timeout.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

PLATFORM, AGENT = "ember_platform", "ember_runtime"
DEFAULT_PORT = 8700
TIMEOUT_S = 2.0


def module_of(argv: Sequence[str]) -> str | None:
    """The module a ``python -m MODULE ...`` command line runs; None for any other command (tini's among them,
    whose own command line holds its child's)."""
    if not argv or not Path(argv[0]).name.startswith("python"):
        return None
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[i + 1]
    return None


def option(argv: Sequence[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` (the last one given, as argparse takes it)."""
    found = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(name + "="):
            found = arg[len(name) + 1:]
    return found


def health_url(argv: Sequence[str]) -> str | None:
    """Where a control plane started with ``argv`` answers ``/healthz``; None when that cannot be known."""
    url_file = option(argv, "--url-file")
    port = option(argv, "--port") or str(DEFAULT_PORT)
    if port == "0":  # a free port: only its URL file says which
        try:
            return Path(url_file).read_text().strip() + "/healthz" if url_file else None
        except OSError:
            return None
    if not port.isdigit():
        return None
    host = option(argv, "--host") or "127.0.0.1"
    if host in ("0.0.0.0", "::", "[::]", ""):  # every address: ask through the loopback
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/healthz"


def ember_processes(proc: Path = Path("/proc")) -> Iterator[list[str]]:
    """The command lines of this container's Ember processes."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:  # gone since the listing
            continue
        if module_of(argv) in (PLATFORM, AGENT):
            yield argv


def answers(url: str, timeout_s: float = TIMEOUT_S) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def healthy(processes: Sequence[Sequence[str]]) -> tuple[bool, str]:
    """Whether these Ember processes are healthy, and why not."""
    if not processes:
        return False, "no Ember process runs in this container"
    for argv in processes:
        if module_of(argv) == PLATFORM:
            url = health_url(argv)
            if url is None:
                return False, "cannot tell where the control plane listens"
            if not answers(url):
                return False, f"{url} does not answer 200"
    return True, "ok"


def main(proc: Path = Path("/proc")) -> int:
    ok, why = healthy(list(ember_processes(proc)))
    if not ok:
        print(why, file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
