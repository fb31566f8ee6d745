"""Every error answer has the same JSON shape: ``{"error": {"code", "message", "field", ...}}``."""

from __future__ import annotations

import math

from starlette.requests import Request
from starlette.responses import Response

from ember._errors import EmberError, error_class
from ember.wire import ErrorBody, ErrorInfo, encoder, error_info
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


async def http_error_handler(_request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "bad_request")
    return error_response(ErrorInfo(code=code, message=str(getattr(exc, "detail", exc))), status)
