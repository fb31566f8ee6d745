"""The one transport seam between the SDK and the platform: HTTP at ``EMBER_URL``.

Transport exceptions never leave this module: they become Ember's own errors, ``raise ... from``.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import TYPE_CHECKING, Any

import msgspec

from ember._errors import ConnectionError, DeadlineExceededError, EmberError, error_class
from ember._wire import HTTP_TIMEOUT_HEADER, ErrorBody

if TYPE_CHECKING:
    import httpx

DEFAULT_URL = "http://127.0.0.1:8700"
_error_decoder = msgspec.json.Decoder(ErrorBody)


def platform_url() -> str:
    """The platform's base URL: ``EMBER_URL``, or the local development platform."""
    return os.environ.get("EMBER_URL", DEFAULT_URL).rstrip("/")


class Transport:
    """Speaks the platform's HTTP API; thread-safe, one connection pool per instance."""

    def __init__(self, url: str | None = None, *, timeout_s: float = 300.0) -> None:
        import httpx

        self.url = (url or platform_url()).rstrip("/")
        self._client = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=5.0),
                                    limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    def close(self) -> None:
        self._client.close()

    def invoke(self, app: str, name: str, body: bytes, *, timeout_s: float | None = None) -> bytes:
        """Call ``app.name`` with a JSON body; returns the result as raw JSON."""
        headers = {"content-type": "application/json"}
        if timeout_s is not None:
            headers[HTTP_TIMEOUT_HEADER] = str(timeout_s)
        return self.request("POST", f"/v1/{app}/{name}", content=body, headers=headers).content

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """An HTTP request to the platform; a non-2xx answer raises the matching EmberError."""
        import httpx

        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise DeadlineExceededError(f"{method} {self.url}{path} timed out") from exc
        except httpx.TransportError as exc:
            raise ConnectionError(
                f"cannot reach the Ember platform at {self.url} ({exc}); is `ember dev` running, "
                "or EMBER_URL set?") from exc
        if response.status_code >= 400:
            raise _error_from(response)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return msgspec.json.decode(self.request(method, path, **kwargs).content)


def _error_from(response: httpx.Response) -> EmberError:
    try:
        info = _error_decoder.decode(response.content).error
    except msgspec.MsgspecError:
        return EmberError(f"HTTP {response.status_code}: {response.text[:500]}")
    return error_class(info.code)(info.message, field=info.field, retry_after_s=info.retry_after_s,
                                  remote_type=info.type, call_id=info.call_id)


_transports: dict[str, Transport] = {}
_lock = threading.Lock()


@atexit.register
def _close_transports() -> None:
    with _lock:
        for transport in _transports.values():
            transport.close()
        _transports.clear()


def default_transport() -> Transport:
    """The shared transport for the current ``EMBER_URL``."""
    url = platform_url()
    with _lock:
        if url not in _transports:
            _transports[url] = Transport(url)
        return _transports[url]
