"""``ember login [--url URL]``: check a token against the platform and save it for the SDK and the CLI.

The token is read from standard input (``ember login < token-file``, or piped) or typed at a hidden prompt: never
from the command line, where other users' ``ps`` would see it.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from ember._client import Transport, platform_url
from ember._credentials import save_credentials
from ember._tokens import own_token


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("login", help="save a token (read from stdin or a hidden prompt) for the platform at URL")
    p.add_argument("--url", default=None, help="the platform (default: EMBER_URL, or the one saved before)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    url = (args.url or platform_url()).rstrip("/")
    token = (getpass.getpass(f"token for {url}: ") if sys.stdin.isatty() else sys.stdin.readline()).strip()
    if not token:
        raise SystemExit("ember: no token given (pipe it in, or type it at the prompt)")
    transport = Transport(url, token=token)
    try:
        info = own_token(transport)
    finally:
        transport.close()
    path = save_credentials(url, token)
    print(f"logged in to {url} with token {info.id} ({','.join(info.scopes)} on {','.join(info.apps)}); saved in "
          f"{path}")
    return 0
