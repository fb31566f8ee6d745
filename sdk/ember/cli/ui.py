"""``ember ui``: open the web console in a browser, signed in with this CLI's token.

The token travels in the URL's fragment (``/ui#token=...``): a browser never sends a fragment to a server, so it
stays out of access logs and proxies; the page moves it to the tab's session storage and takes it off the URL.
"""

from __future__ import annotations

import argparse
import sys
import webbrowser
from urllib.parse import quote

from ember._credentials import platform_token, platform_url
from ember._errors import UnauthenticatedError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("ui", help="open the web console in a browser, signed in")
    p.add_argument("--print-url", action="store_true",
                   help="print the signed-in URL instead of opening it (it holds the token: treat it as one)")
    p.set_defaults(run=run)


def console_url(base: str, token: str) -> str:
    """The console's address at ``base``, signed in with ``token`` (in the fragment, never in a query string)."""
    return f"{base.rstrip('/')}/ui#token={quote(token, safe='')}"


def run(args: argparse.Namespace) -> int:
    base = platform_url()
    token = platform_token(base)
    if not token:
        raise UnauthenticatedError(f"no token for {base}: run `ember login` or set EMBER_TOKEN")
    url = console_url(base, token)
    if args.print_url:
        print(url)
        return 0
    if not webbrowser.open(url):
        print(f"ember: could not start a browser; open {base}/ui and paste your token, or run "
              "`ember ui --print-url`", file=sys.stderr)
        return 1
    print(f"opened {base}/ui, signed in")
    return 0
