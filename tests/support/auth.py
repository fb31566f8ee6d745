"""Tokens in tests: the header that carries one, and an HTTP client that sends the embedded platform's."""

from __future__ import annotations

from typing import Any

import httpx

from ember._client import ssl_context
from ember.dev.embedded import EmbeddedPlatform


def bearer(token: str) -> dict[str, str]:
    """The ``Authorization`` header that sends ``token``."""
    return {"Authorization": f"Bearer {token}"}


def authed_client(platform: EmbeddedPlatform, **kwargs: Any) -> httpx.Client:
    """An HTTP client of ``platform`` that sends its admin token (``base_url`` and ``timeout`` may be overridden)."""
    kwargs.setdefault("base_url", platform.url)
    kwargs.setdefault("timeout", 60)
    kwargs.setdefault("verify", ssl_context())  # the process's one: building a context costs 30-90 ms of CPU
    return httpx.Client(headers=bearer(platform.token), **kwargs)
