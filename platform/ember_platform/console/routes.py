"""``GET /ui`` and ``GET /ui/<file>``: the console's static shell, open to anyone; its data comes from the HTTP API
with the reader's token, which the page takes from the URL's fragment (``/ui#token=...``, never sent to a server).

Safe by construction: the files served are the ones listed in ``static/`` when the module loads, looked up by
exact name (no path is ever joined with what a request says, so ``..`` and ``%2f`` name nothing); each answer
carries its content type, ``X-Content-Type-Options: nosniff`` and a Content-Security-Policy that allows only this
origin's own scripts, styles and API (no inline script, no other site, no framing). A token in the query string
is refused (400): query strings end up in logs, proxies and browser history.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from ember._errors import BadRequestError, NotFoundError

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
_TOKEN_PARAMS = {"token", "access_token", "auth", "authorization"}


def _load() -> dict[str, tuple[bytes, str]]:
    folder = resources.files("ember_platform.console") / "static"
    files = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return files


FILES = _load()


def _refuse_token_in_query(request: Request) -> None:
    if _TOKEN_PARAMS & {k.lower() for k in request.query_params}:
        raise BadRequestError("a token never goes in a query string (it would be kept in logs and history): "
                              "open /ui#token=<token>, or `ember ui`", field="token")


def _serve(name: str) -> Response:
    found = FILES.get(name)
    if found is None:
        raise NotFoundError(f"the console has no file {name[:80]!r}")
    body, content_type = found
    return Response(body, media_type=content_type, headers=HEADERS)


async def index(request: Request) -> Response:
    """``GET /ui``: the console's page."""
    _refuse_token_in_query(request)
    return _serve("index.html")


async def asset(request: Request) -> Response:
    """``GET /ui/<file>``: one of the console's files, by its exact name."""
    _refuse_token_in_query(request)
    return _serve(request.path_params["name"])
