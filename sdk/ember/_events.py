"""Events through the platform's API: ``POST /v1/events/<subject>``, for a publisher that would rather not speak
NATS (a token with the ``events`` scope; the subject must be bound by a function of one of its apps)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ember._client import Transport, default_transport


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
