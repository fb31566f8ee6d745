"""Error codes map to classes and HTTP statuses, both ways, so a remote failure raises the same type."""

import pickle

import httpx
import pytest

import ember
from ember._client import _error_from
from ember._errors import error_class
from ember.wire import ErrorBody, ErrorInfo, encoder

TABLE = [
    ("internal", ember.EmberError, 500),
    ("invalid_spec", ember.InvalidSpecError, 400),
    ("bad_request", ember.BadRequestError, 400),
    ("unauthenticated", ember.UnauthenticatedError, 401),
    ("forbidden", ember.ForbiddenError, 403),
    ("not_found", ember.NotFoundError, 404),
    ("conflict", ember.ConflictError, 409),
    ("call_cycle", ember.CallCycleError, 409),
    ("cancelled", ember.CallCancelledError, 409),
    ("invalid_input", ember.InvalidInputError, 422),
    ("payload_too_large", ember.PayloadTooLargeError, 413),
    ("overloaded", ember.OverloadedError, 429),
    ("rate_limited", ember.RateLimitedError, 429),
    ("unavailable", ember.UnavailableError, 503),
    ("deadline_exceeded", ember.DeadlineExceededError, 504),
    ("user_error", ember.RemoteError, 500),
    ("connection", ember.ConnectionError, 502),
]


@pytest.mark.parametrize(("code", "cls", "status"), TABLE, ids=[row[0] for row in TABLE])
def test_code_class_and_status(code: str, cls: type[ember.EmberError], status: int) -> None:
    assert error_class(code) is cls
    assert cls.code == code
    assert cls.http_status == status
    assert issubclass(cls, ember.EmberError)


def test_every_public_error_is_in_the_table() -> None:
    public = {getattr(ember, name) for name in ember.__all__}
    errors = {obj for obj in public if isinstance(obj, type) and issubclass(obj, BaseException)}
    assert errors == {cls for _, cls, _ in TABLE}


@pytest.mark.parametrize("code", ["", "teapot", "INVALID_INPUT", "method_not_allowed"])
def test_unknown_codes_are_ember_errors(code: str) -> None:
    assert error_class(code) is ember.EmberError


def test_standard_library_bases() -> None:
    assert issubclass(ember.InvalidSpecError, ValueError)
    assert issubclass(ember.DeadlineExceededError, TimeoutError)


def test_error_attributes_and_str() -> None:
    err = ember.OverloadedError("queue full", field="$.x", retry_after_s=2.0, remote_type="Q", call_id="c-1")
    assert (err.message, err.field, err.retry_after_s, err.remote_type, err.call_id) == (
        "queue full", "$.x", 2.0, "Q", "c-1")
    assert str(err) == "queue full (at $.x)"
    assert str(ember.NotFoundError("no app")) == "no app"


def test_errors_survive_pickling() -> None:
    err = ember.InvalidInputError("bad", field="$.a", call_id="c-1")
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is ember.InvalidInputError
    assert (copy.message, copy.field, copy.call_id, str(copy)) == ("bad", "$.a", "c-1", "bad (at $.a)")


# --- the client's HTTP seam --------------------------------------------------------------------


@pytest.mark.parametrize(("code", "cls", "status"), TABLE, ids=[row[0] for row in TABLE])
def test_http_error_body_raises_its_class(code: str, cls: type[ember.EmberError], status: int) -> None:
    info = ErrorInfo(code=code, message="it failed", field="$.x", type="KeyError", retry_after_s=1.0,
                     call_id="c-9")
    err = _error_from(httpx.Response(status, content=encoder.encode(ErrorBody(error=info))))
    assert type(err) is cls
    assert (err.message, err.field, err.remote_type, err.retry_after_s, err.call_id) == (
        "it failed", "$.x", "KeyError", 1.0, "c-9")


def test_http_error_without_an_error_body() -> None:
    err = _error_from(httpx.Response(502, content=b"<html>Bad Gateway</html>"))
    assert type(err) is ember.EmberError
    assert err.message == "HTTP 502: <html>Bad Gateway</html>"


def test_the_connection_error_is_also_the_builtin_one() -> None:
    # ``ember.ConnectionError`` keeps its public name; it is a builtin ConnectionError too, so that code catching
    # the builtin (or holding it under a star-import of ember) still catches it.
    import builtins

    assert issubclass(ember.ConnectionError, builtins.ConnectionError)
    with pytest.raises(builtins.ConnectionError):
        raise ember.ConnectionError("cannot reach the Ember platform")
