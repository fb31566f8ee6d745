"""Every error answer of Ember's API has the same JSON shape: ``{"error": {"code", "message", "field", ...}}``; under
/v2 (the Open Inference Protocol) and /openai/ the router's own answers take those APIs' shapes (``_shaped``)."""

from __future__ import annotations

import math

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match

from ember._errors import EmberError, error_class
from ember.wire import RESERVED_APP_NAMES, ErrorBody, ErrorInfo, encoder, error_info
from ember_platform.auth.tokens import TokenRefused


def error_response(info: ErrorInfo, status: int | None = None) -> Response:
    status = status or error_class(info.code).http_status
    headers = {}
    if info.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(info.retry_after_s)))
    if info.call_id:
        headers["X-Ember-Call-Id"] = info.call_id
    return Response(encoder.encode(ErrorBody(error=info)), status_code=status, headers=headers,
                    media_type="application/json")


def ember_error_response(exc: EmberError) -> Response:
    response = error_response(error_info(exc), exc.http_status)
    if isinstance(exc, TokenRefused):
        response.headers["WWW-Authenticate"] = exc.challenge
    return response


async def ember_error_handler(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EmberError)
    return ember_error_response(exc)


async def http_error_handler(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    if status == 405:
        return method_not_allowed(request)
    code = {404: "not_found"}.get(status, "bad_request")
    return _shaped(request, status, code, str(getattr(exc, "detail", exc)))


def method_not_allowed(request: Request) -> Response:
    """A path the API has, asked with a method it does not take: 405 with ``Allow`` (RFC 9110: every method of
    every route of that path, one route per method here), or, asked with OPTIONS, 204 with the same ``Allow``."""
    allowed = path_methods(request) or path_methods(request, fallbacks=True)
    allow = {"Allow": ", ".join(sorted({"OPTIONS", *allowed}))}
    if request.method == "OPTIONS":
        return Response(status_code=204, headers=allow)
    response = _shaped(request, 405, "method_not_allowed",
                       f"{request.method} is not allowed here; allowed: {allow['Allow']}")
    response.headers.update(allow)
    return response


def _shaped(request: Request, status: int, code: str, message: str) -> Response:
    """An error the router answers (no route, a method the path does not take) in the shape of the API asked: the
    Open Inference Protocol's ``{"error": message}`` under /v2, OpenAI's under /openai/, Ember's elsewhere."""
    if request.url.path == "/v2" or request.url.path.startswith("/v2/"):
        return Response(encoder.encode({"error": message}), status, media_type="application/json")
    if request.url.path.startswith("/openai/"):
        return Response(encoder.encode({"error": {"message": message, "type": "invalid_request_error",
                                                  "param": None, "code": code}}), status,
                        media_type="application/json")
    return error_response(ErrorInfo(code=code, message=message), status)


def path_methods(request: Request, *, fallbacks: bool = False) -> set[str]:
    """The methods of the routes whose path is the request's: its own routes, or with ``fallbacks`` the catch-alls
    (``/v2/{path:rest}``, the protocol's 404 for any path it does not have). ``/v1/apps/x`` is no call of an app
    named ``apps``."""
    methods: set[str] = set()
    for candidate in request.app.router.routes:
        match, child = candidate.matches(request.scope)
        app = str(child.get("path_params", {}).get("app", "")).partition("@")[0]
        fallback = ":rest}" in getattr(candidate, "path", "")
        if match != Match.NONE and app not in RESERVED_APP_NAMES and fallback == fallbacks:
            methods |= set(getattr(candidate, "methods", None) or ())
    return methods
