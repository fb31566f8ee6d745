"""What a queued or event message's headers ask for, checked before any of it is used.

A message's call id becomes a key in the ``ember_calls`` bucket (``s.<app>.<id>``, ``r.<app>.<id>``), a key name
and part of a dead letter's ``Nats-Msg-Id``, so it must be one KV key token: ``CALL_ID`` (letters, digits,
``-`` and ``_``, at most ``MAX_CALL_ID`` characters; no ``.``, which would add a key level, no wildcard,
no space), the rule of ``ember.wire.headers`` that the gateway applies to ``POST /v1/events``'s
``Idempotency-Key`` too. A deadline must be a finite number (seconds since the epoch). A result subject must be a
plain subject outside Ember's and the server's own.

Ids of the two kinds of message never meet:

- a **queued** call (``EMBER_CALLS``) is named by the platform, which sets ``Ember-Call-Id``
  (``<app>_<32 hexadecimal digits>``: no ``-`` after the app);
- an **event** is named ``ev-<scope>-<Nats-Msg-Id>`` when its publisher sets a valid ``Nats-Msg-Id``
  and ``evs-<scope>-<stored at, µs>-<stream sequence>`` otherwise, where ``<scope>`` is a digest of the
  function's event stream. Its ``Ember-Call-Id`` header is ignored: a publisher can neither name a
  spawned call nor another function's event. The default id depends only on the stored message (its
  redeliveries map to the same id, so the first result wins) and differs across re-creations of the
  stream, whose sequence starts again at 1.

A message whose headers fail these checks is settled at once, as failed, with ``problem`` saying which
header was wrong and why; it is never redelivered.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import re
from dataclasses import dataclass

from ember._errors import InvalidInputError
from ember.wire import CALL_ID_HEADER, DEADLINE_HEADER, EVENT_REPLY_TO_HEADER, subjects
from ember.wire.headers import MAX_MSG_CALL_ID as MAX_CALL_ID  # noqa: F401 (re-exported, as the replica names it)
from ember.wire.headers import MSG_CALL_ID as CALL_ID
from ember.wire.headers import MSG_CALL_ID_RULE, MSG_ID_HEADER
from ember.wire.subjects import event_scope as event_scope  # re-exported: the replica names its events by it

MAX_DEADLINE_CHARS = 64
MAX_SUBJECT_CHARS = 256
_SUBJECT_TOKEN = re.compile(r"[^\s\x00-\x1f\x7f.*>]+")  # no space, control, separator or wildcard
_SHOWN = 40  # characters of a bad value quoted in an error
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MICROSECOND = datetime.timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Delivery:
    """The call a message stands for: its id and deadline, and why it cannot be run, if it cannot."""

    call_id: str
    deadline: float = math.inf
    problem: InvalidInputError | None = None


def microseconds(timestamp: datetime.datetime) -> int:
    """A message's timestamp (from its metadata, in UTC) as whole microseconds since the epoch, exactly."""
    return (timestamp - _EPOCH) // _MICROSECOND


def default_event_id(scope: str, stored_at_us: int, sequence: int) -> str:
    """The id of an event published without a (valid) ``Nats-Msg-Id``."""
    return f"evs-{scope}-{stored_at_us}-{sequence}"


def queued_delivery(headers: dict[str, str], default_id: str) -> Delivery:
    """A message of ``EMBER_CALLS``: the id the platform set (``Ember-Call-Id``, else ``Nats-Msg-Id``)."""
    raw_id = headers.get(CALL_ID_HEADER) or headers.get(MSG_ID_HEADER)
    call_id, problem = default_id, None
    if raw_id:
        problem = _call_id_problem(CALL_ID_HEADER if headers.get(CALL_ID_HEADER) else MSG_ID_HEADER, raw_id)
        if problem is None:
            call_id = raw_id
    deadline, late = _deadline(headers)
    return _delivery(call_id, deadline, problem or late)


def event_delivery(headers: dict[str, str], scope: str, default_id: str, result_subject: str | None = None, *,
                   app: str) -> Delivery:
    """A message of a function's event stream; ``Ember-Call-Id`` is ignored (see the module's docstring)."""
    raw_id = headers.get(MSG_ID_HEADER)
    call_id, problem = default_id, None
    if raw_id:
        problem = _call_id_problem(MSG_ID_HEADER, raw_id)
        if problem is None:
            call_id = f"ev-{scope}-{raw_id}"
    deadline, late = _deadline(headers)
    misdirected = _reply_to(headers, app, result_subject)[1]
    return _delivery(call_id, deadline, problem or late or misdirected)


def _delivery(call_id: str, deadline: float, problem: InvalidInputError | None) -> Delivery:
    if problem is not None:
        problem.call_id = call_id
    return Delivery(call_id, deadline, problem)


def _call_id_problem(header: str, value: str) -> InvalidInputError | None:
    if CALL_ID.fullmatch(value):
        return None
    return _bad(header, value, f"a call id is {MSG_CALL_ID_RULE}")


def _deadline(headers: dict[str, str]) -> tuple[float, InvalidInputError | None]:
    raw = headers.get(DEADLINE_HEADER)
    if raw is None:
        return math.inf, None
    value = math.nan
    if len(raw) <= MAX_DEADLINE_CHARS:
        with contextlib.suppress(ValueError):
            value = float(raw)
    if not math.isfinite(value):
        return math.inf, _bad(DEADLINE_HEADER, raw, "a deadline is a finite number of seconds since the epoch")
    return value, None


def reply_subject(headers: dict[str, str], app: str, result_subject: str | None = None) -> str | None:
    """The message's ``Ember-Reply-To`` if it is one a result of ``app`` may be published to, else None."""
    return _reply_to(headers, app, result_subject)[0]


def _reply_to(headers: dict[str, str], app: str,
              result_subject: str | None) -> tuple[str | None, InvalidInputError | None]:
    """A result goes to a requester's reply subject under the app (``_EMBER.replies.<app>.<...>``) or to the
    function's own ``result_subject``: a replica's NATS permissions let it publish nowhere else (never into another
    client's ``_INBOX``)."""
    raw = headers.get(EVENT_REPLY_TO_HEADER)
    if not raw:
        return None, None
    tokens = raw.split(".")
    if len(raw) > MAX_SUBJECT_CHARS or not all(_SUBJECT_TOKEN.fullmatch(t) for t in tokens):
        return None, _bad(EVENT_REPLY_TO_HEADER, raw, f"a result subject is a NATS subject of at most "
                          f"{MAX_SUBJECT_CHARS} characters, without wildcards or spaces")
    replies = f"{subjects.EVENT_REPLIES_ROOT}.{app}."
    if (raw.startswith(replies) and len(raw) > len(replies)) or raw == result_subject:
        return raw, None
    elsewhere = f" or to the function's result_subject {result_subject!r}" if result_subject else ""
    return None, _bad(EVENT_REPLY_TO_HEADER, raw, f"results are published to a reply subject of the app "
                      f"({replies}<...>){elsewhere}, nowhere else")


def _bad(header: str, value: str, why: str) -> InvalidInputError:
    shown = repr(value) if len(value) <= _SHOWN else f"{value[:_SHOWN]!r}... ({len(value)} characters)"
    return InvalidInputError(f"header {header} {shown} is not valid: {why}", field=f"headers.{header}")
