"""Events through the platform's API: ``POST /v1/events/<subject>``, for a publisher that would rather not speak
NATS (a token with the ``events`` scope; the subject must be bound by a function of one of its apps)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ember._client import Transport, default_transport
from ember._errors import InvalidSpecError
from ember.wire.validate import subject_problem


def publish_event(subject: str, data: bytes, *, idempotency_key: str | None = None,
                  transport: Transport | None = None) -> dict[str, Any]:
    """Publish ``data`` to ``subject``; the answer names the stream that stored it and its sequence (``seq``).
    ``idempotency_key`` makes a retried publish stored, and run, once."""
    headers = {"content-type": "application/octet-stream"}
    if idempotency_key:
        headers["idempotency-key"] = idempotency_key
    response = (transport or default_transport()).request("POST", f"/v1/events/{quote(subject, safe='')}",
                                                          content=data, headers=headers)
    answer: dict[str, Any] = response.json()
    return answer


def check_events(where: str, on: Any, result_subject: Any) -> list[str]:
    subjects = [on] if isinstance(on, str) else list(on or [])
    checks = [(s, True) for s in subjects] + ([(result_subject, False)] if result_subject is not None else [])
    for subject, wildcards in checks:
        problem = subject_problem(subject, wildcards=wildcards) if isinstance(subject, str) else "not a string"
        if problem:
            raise InvalidSpecError(f"{where}(on={on!r}, result_subject={result_subject!r}): {problem} (wildcards "
                                   "only in on=)")
    if result_subject is not None and not subjects:
        raise InvalidSpecError(f"{where}(result_subject=...): only events have result subjects; add on=...")
    return subjects
