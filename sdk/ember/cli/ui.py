"""``ember ui``: open the web console in a browser, signed in with this CLI's token.

The token travels in the URL's fragment (``/ui#token=...``): a browser never sends a fragment to a server, so it
stays out of access logs and proxies; the page moves it to the tab's session storage and takes it off the URL. The
browser is not given that URL on its command line (which any local user reads in ``ps`` for as long as a browser it
started lives): it opens a page written beside the credentials (``console.html``, mode 0600, in their 0700 folder,
written anew each time) that sends it there.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
import webbrowser
from pathlib import Path
from urllib.parse import quote

from ember._credentials import credentials_path, platform_token, platform_url
from ember._errors import UnauthenticatedError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("ui", help="open the web console in a browser, signed in")
    p.add_argument("--print-url", action="store_true",
                   help="print the signed-in URL instead of opening it (it holds the token: treat it as one)")
    p.set_defaults(run=run)


def console_url(base: str, token: str) -> str:
    """The console's address at ``base``, signed in with ``token`` (in the fragment, never in a query string)."""
    return f"{base.rstrip('/')}/ui#token={quote(token, safe='')}"


def sign_in_page(url: str, path: Path | None = None) -> Path:
    """A page that sends the browser to ``url`` (which holds the token), written mode 0600 in the credentials' own
    folder (0700); its path, which alone goes on a browser's command line."""
    path = path or credentials_path().with_name("console.html")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # anew: never written through a file or link left there
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    target = html.escape(url, quote=True)
    with os.fdopen(fd, "w") as f:
        f.write(f'<!doctype html><meta charset="utf-8"><meta name="referrer" content="no-referrer">'
                f'<meta http-equiv="refresh" content="0; url={target}"><title>Ember</title>'
                f'<a href="{target}">Open the Ember console</a>\n')
    return path


def run(args: argparse.Namespace) -> int:
    base = platform_url()
    token = platform_token(base)
    if not token:
        raise UnauthenticatedError(f"no token for {base}: run `ember login` or set EMBER_TOKEN")
    url = console_url(base, token)
    if args.print_url:
        print(url)
        return 0
    if not webbrowser.open(sign_in_page(url).as_uri()):
        print(f"ember: could not start a browser; open {base}/ui and paste your token, or run "
              "`ember ui --print-url`", file=sys.stderr)
        return 1
    print(f"opened {base}/ui, signed in")
    return 0
