"""Ember's exception hierarchy.

Every error a user sees from the SDK is an :class:`EmberError`. Errors that cross the wire carry a
``code``; :func:`error_class` maps a wire error back to its class, so that a call that fails in
a replica raises the same type in the caller as it would over HTTP.
"""

from __future__ import annotations

import builtins
from typing import ClassVar


class EmberError(Exception):
    """Base class of every error raised by Ember."""

    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, *, field: str | None = None, retry_after_s: float | None = None,
                 remote_type: str | None = None, call_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s
        self.remote_type = remote_type
        self.call_id = call_id

    def __str__(self) -> str:
        where = f" (at {self.field})" if self.field else ""
        return f"{self.message}{where}"


class InvalidSpecError(EmberError, ValueError):
    """A decorator or app definition was given arguments it cannot accept."""

    code = "invalid_spec"
    http_status = 400


class BadRequestError(EmberError):
    """The request could not be parsed (malformed JSON, bad header)."""

    code = "bad_request"
    http_status = 400


class UnauthenticatedError(EmberError):
    """The platform did not accept the request's token: none was sent, or it is malformed, unknown, revoked or
    expired (HTTP 401). Set ``EMBER_TOKEN``, or run ``ember login``.

    Example:
        >>> try:
        ...     ember.lookup("hello", "greet").remote("Ada")
        ... except ember.UnauthenticatedError as exc:
        ...     print(exc)  # missing Authorization header: ... (at Authorization)
    """

    code = "unauthenticated"
    http_status = 401


class ForbiddenError(EmberError):
    """The token is valid but lacks the scope the request needs (HTTP 403): for example an ``invoke`` token
    that tries to deploy. An app the token may not see at all answers ``NotFoundError`` instead."""

    code = "forbidden"
    http_status = 403


class NotFoundError(EmberError):
    """The app, function or call does not exist."""

    code = "not_found"
    http_status = 404


class ConflictError(EmberError):
    """The request conflicts with the resource's state (e.g. cancelling a call that already runs).

    The SDK's ``FunctionCall.cancel()`` answers ``False`` instead of raising it; the HTTP API answers 409.

    Example:
        >>> call = ember.FunctionCall.from_id(call_id)
        >>> call.cancel()  # the platform answered 409 "conflict": the call already runs
        False
    """

    code = "conflict"
    http_status = 409


class CallCycleError(ConflictError):
    """A function called a function that is already waiting on this very call (``a`` calls ``b`` calls ``a``):
    its replicas' slots may all be held by the calls waiting, so the call could deadlock; it is refused at once.

    Example:
        >>> try:
        ...     other.remote(x)
        ... except ember.CallCycleError as exc:
        ...     print(exc)  # names the chain: app-a.f -> app-b.g -> app-a.f
    """

    code = "call_cycle"


class InvalidInputError(EmberError):
    """The input does not match the function's declared type; ``field`` names the culprit."""

    code = "invalid_input"
    http_status = 422


class PayloadTooLargeError(EmberError):
    """The request body is larger than the platform accepts."""

    code = "payload_too_large"
    http_status = 413


class OverloadedError(EmberError):
    """The function's queue is full; retry after ``retry_after_s``."""

    code = "overloaded"
    http_status = 429


class RateLimitedError(OverloadedError):
    """A quota refused the call: its request rate or its concurrent calls are used up (HTTP 429, code
    ``rate_limited``); retry after ``retry_after_s``. An ``OverloadedError``, so that code catching that catches it."""

    code = "rate_limited"
    http_status = 429


class UnavailableError(EmberError):
    """No replica became ready within the call's deadline; retry after ``retry_after_s``."""

    code = "unavailable"
    http_status = 503


class DeadlineExceededError(EmberError, TimeoutError):
    """The call did not finish before its deadline."""

    code = "deadline_exceeded"
    http_status = 504


class CallCancelledError(EmberError):
    """The call was cancelled (``DELETE /v1/calls/<id>``, ``FunctionCall.cancel()``, or its caller's cancel)."""

    code = "cancelled"
    http_status = 409


class RemoteError(EmberError):
    """User code raised; ``remote_type`` is the name of the exception's class."""

    code = "user_error"
    http_status = 500


class PlatformUnreachableError(EmberError, builtins.ConnectionError):
    """The platform could not be reached (``ember.ConnectionError``).

    Also a builtin ``ConnectionError``, so that ``except ConnectionError`` catches it whichever name is in scope.
    """

    code = "connection"
    http_status = 502


_BY_CODE: dict[str, type[EmberError]] = {
    cls.code: cls
    for cls in (EmberError, InvalidSpecError, BadRequestError, UnauthenticatedError, ForbiddenError, NotFoundError,
                ConflictError, CallCycleError, InvalidInputError, PayloadTooLargeError, OverloadedError,
                RateLimitedError, UnavailableError, DeadlineExceededError, RemoteError, PlatformUnreachableError,
                CallCancelledError)
}

# The public name (``ember.ConnectionError``), kept for compatibility; inside Ember the class goes by the name
# above, so that no module of Ember shadows the builtin.
ConnectionError = PlatformUnreachableError


def error_class(code: str) -> type[EmberError]:
    """The error class for a wire ``code`` (``EmberError`` for codes this SDK does not know)."""
    return _BY_CODE.get(code, EmberError)
