"""Every route declares what it needs, and is built by ``route`` so that the check runs before its handler.

A route needs a scope (``admin``, ``deploy``, ``invoke``, ``read``, ``events``), ``TOKEN`` (any valid token), or
is ``OPEN`` (the probes alone). A route whose path has ``{app}`` is checked against that app: a token that does
not see it gets the 404 of an app that does not exist. ``POST /v1/<app>/<fn>`` checks itself (``checks_itself``), after
finding the function, since a ``public=True`` function needs no token; the hot path in ``asgi.Gateway`` calls the
same handler. A test walks the route table and fails on a route that declares nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, Literal
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.routing import Route

from ember._errors import ForbiddenError
from ember_platform.auth.bootstrap import loopback_only
from ember_platform.auth.scopes import Principal
from ember_platform.gateway.responses import platform_of

Need = Literal["open", "token", "admin", "deploy", "invoke", "read", "events"]
OPEN: Need = "open"
TOKEN: Need = "token"
NEED = "ember_need"  # the attribute of a route's endpoint that holds what it needs
_PRINCIPAL = "ember.principal"  # where a checked request keeps its principal, in its ASGI scope
Endpoint = Callable[[Request], Awaitable[Any]]


def authorization(request: Request) -> str | None:
    """The ``Authorization`` header's value, read straight from the ASGI scope (the hot path reads it too)."""
    for key, value in request.scope["headers"]:
        if key == b"authorization":
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None


def authorize(request: Request, need: Need, app: str | None = None) -> Principal:
    """The request's principal, if it may do what ``need`` says (on ``app``): else 401, 404 (an app it does not
    see) or 403 (a scope it does not hold)."""
    tokens = platform_of(request).tokens
    if not tokens.enabled:
        from_this_machine(request)
    principal = tokens.authenticate(authorization(request))
    if need != TOKEN:
        principal.require(need, app)
    request.scope[_PRINCIPAL] = principal
    return principal


def from_this_machine(request: Request) -> None:
    """Without tokens (``--insecure-no-auth``, loopback only), a request is served only when it names a loopback
    ``Host`` and comes from no other site's page (an ``Origin``, when sent, on a loopback host): else 403. A web page
    the developer visits could otherwise send requests to the port (a form's POST needs no preflight), or read the
    answers once its own name resolves to 127.0.0.1 (DNS rebinding), and deploy code there."""
    host = _host_of(_header(request, b"host") or "")
    origin = _header(request, b"origin")
    if not loopback_only(host) or (origin is not None and not loopback_only(urlsplit(origin).hostname or "")):
        raise ForbiddenError("without tokens (--insecure-no-auth) this platform serves requests to a loopback "
                             "address (Host 127.0.0.1, ::1 or localhost) from no other site's page; "
                             f"Host {host[:80]!r}" + (f", Origin {origin[:80]!r}" if origin is not None else ""))


def _header(request: Request, name: bytes) -> str | None:
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None


def _host_of(host: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:8000`` -> ``::1``)."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def principal_of(request: Request) -> Principal:
    """The principal ``authorize`` found for this request."""
    principal: Principal = request.scope[_PRINCIPAL]
    return principal


def checks_itself(need: Need) -> Callable[[Endpoint], Endpoint]:
    """Mark a handler that calls ``authorize`` itself (for ``need``), at the point where it can."""
    def mark(endpoint: Endpoint) -> Endpoint:
        setattr(endpoint, NEED, need)
        return endpoint

    return mark


def route(path: str, endpoint: Endpoint, method: str, need: Need) -> Route:
    """A route of the table whose handler runs only once the request may do what ``need`` says."""
    if need == OPEN or getattr(endpoint, NEED, None) == need:
        guarded = endpoint
    else:
        @functools.wraps(endpoint)
        async def guarded(request: Request) -> Any:
            app = request.path_params.get("app")  # a call may pin a version (<app>@<version>): the app is checked
            authorize(request, need, app.partition("@")[0] if app is not None else None)
            return await endpoint(request)

    setattr(guarded, NEED, need)
    return Route(path, guarded, methods=[method])
