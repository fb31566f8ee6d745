"""``POST /v1/events/<subject>``: publish an event over HTTP, for those who would rather not speak NATS.

It needs a token with the ``events`` scope, as a plain NATS client presenting that token does
(``ember_platform.natsauth.clients``), and may publish exactly where such a client may: to a subject bound
(``on=``) by a function of an app the token sees. The subject is hostile input: NATS tokens of letters, digits,
``-`` and ``_``, no wildcards, no reserved root, at most ``MAX_SUBJECT_LENGTH`` characters (else 422 naming it);
one no function of the token's apps is bound to is answered 404, as a subject nothing is bound to. The body is the
event's data, at most the server's payload limit (else 413). A function whose event stream is full (its limits:
``StorageLimits.events``) refuses new events with 429 and ``Retry-After``, dropping none that wait. The answer,
202, names the stream that stored it and its sequence there; an ``Idempotency-Key`` header becomes the message's
``Nats-Msg-Id`` (a retried publish is stored, and runs, once), and so the event's call id: it must be one a replica
accepts (``MSG_CALL_ID``: letters, digits, ``-`` and ``_``), else 422 naming the header, rather than an event
stored only to fail unrun.
"""

from __future__ import annotations

from typing import Any

from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.js.errors import APIError as JsAPIError
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import InvalidInputError, NotFoundError, OverloadedError, UnavailableError
from ember.wire.headers import MAX_MSG_CALL_ID, MSG_CALL_ID, MSG_CALL_ID_RULE, MSG_ID_HEADER
from ember.wire.subjects import matches
from ember.wire.validate import MAX_SUBJECT_LENGTH, subject_problem
from ember_platform.gateway.body import header, read_body
from ember_platform.gateway.guard import principal_of
from ember_platform.gateway.openapi_parts import JSON
from ember_platform.gateway.responses import json_response, platform_of
from ember_platform.natsauth.clients import bound_functions

_PUBLISH_TIMEOUT_S = 5.0
STREAM_STORE_FAILED = 10077  # JetStream's err_code for a message a stream did not store; FULL: because it was full
FULL = ("maximum messages exceeded", "maximum bytes exceeded", "maximum messages per subject exceeded")
_FULL_RETRY_AFTER_S = 5.0
# What an event's NATS message carries beside its body (the Nats-Msg-Id header block, at most ~170 bytes): the
# server counts both against its max_payload, and closes a connection that sends more (the control plane's own).
_HEADERS_ROOM_BYTES = 1024
_SHOWN = 40  # characters of a bad key quoted in the error


async def publish(request: Request) -> Response:
    principal = principal_of(request)  # with the events scope (the route's need): a 403 before any subject check
    subject = request.path_params["subject"]
    _check_subject(subject)
    platform = platform_of(request)
    bound, _ = bound_functions(principal, platform.registry.deployments.items.values())
    if not any(matches(pattern, subject) for pattern in bound):
        raise NotFoundError(f"no function is bound to subject {subject!r}")
    data = await read_body(request, platform.nc.max_payload - _HEADERS_ROOM_BYTES)
    msg_id = header(request, b"idempotency-key")
    if msg_id is not None:
        _check_key(msg_id)
    try:
        ack = await platform.nc.jetstream().publish(subject, data, timeout=_PUBLISH_TIMEOUT_S,
                                                    headers={MSG_ID_HEADER: msg_id} if msg_id else None)
    except NoRespondersError:
        raise UnavailableError(f"no stream captures {subject!r} yet (is the app's rollout done?)",
                               retry_after_s=1.0) from None
    except JsAPIError as exc:
        if exc.err_code == STREAM_STORE_FAILED and exc.description in FULL:  # the function's events wait: none dropped
            raise OverloadedError(f"the event stream bound to {subject!r} is full ({exc.description}): its function "
                                  "has that many events still to run; retry later",
                                  retry_after_s=_FULL_RETRY_AFTER_S) from None
        raise UnavailableError(f"the event was not stored ({exc.description}); retry", retry_after_s=1.0) from exc
    except (NatsError, TimeoutError) as exc:
        raise UnavailableError(f"the event was not stored ({type(exc).__name__}); retry", retry_after_s=1.0) from exc
    return json_response({"subject": subject, "stream": ack.stream, "seq": ack.seq, "duplicate": ack.duplicate},
                         202)


def _check_key(key: str) -> None:
    """422 naming ``Idempotency-Key`` unless a replica takes it for the event's call id."""
    if not MSG_CALL_ID.fullmatch(key):
        shown = repr(key) if len(key) <= _SHOWN else f"{key[:_SHOWN]!r}... ({len(key)} characters)"
        raise InvalidInputError(f"Idempotency-Key {shown} is not valid: it becomes the event's {MSG_ID_HEADER} and "
                                f"its call id, {MSG_CALL_ID_RULE}", field="Idempotency-Key")


def _check_subject(subject: str) -> None:
    """422 naming ``subject`` for anything but a plain subject outside the reserved namespaces."""
    problem = subject_problem(subject, wildcards=False) if len(subject) <= MAX_SUBJECT_LENGTH else \
        f"a subject of at most {MAX_SUBJECT_LENGTH} characters, not {len(subject)}"
    if problem:
        raise InvalidInputError(problem if len(problem) < 600 else problem[:600] + "...", field="subject")


_PUBLISHED: dict[str, Any] = {
    "type": "object", "required": ["subject", "stream", "seq", "duplicate"],
    "properties": {"subject": {"type": "string"}, "stream": {"type": "string"}, "seq": {"type": "integer"},
                   "duplicate": {"type": "boolean", "description": "an Idempotency-Key seen before: stored once"}}}
PATH_PARAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "subject": ("a NATS subject bound (on=) by a function of an app the token sees; no wildcards",
                {"type": "string", "minLength": 1, "maxLength": MAX_SUBJECT_LENGTH,
                 "pattern": r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"}),
}
OPERATIONS: dict[tuple[str, str], Any] = {
    ("POST", "/v1/events/{subject}"): (
        "Publish an event (the events scope): the body is its data, stored in the stream of the function bound to "
        "the subject, which runs on it",
        (202, "stored", _PUBLISHED, JSON), (404, 413, 422, 429, 503),
        [{"name": "Idempotency-Key", "in": "header", "required": False,
          "description": f"the message's Nats-Msg-Id and the event's call id, {MSG_CALL_ID_RULE}: a retried "
                         "publish is stored, and runs, once",
          "schema": {"type": "string", "minLength": 1, "maxLength": MAX_MSG_CALL_ID,
                     "pattern": f"^{MSG_CALL_ID.pattern}$"}}],
        {"required": True, "content": {"*/*": {"schema": {"description": "the event's data, as any publisher "
                                                                         "would send it"}}}}),
}
