"""The one transport seam between the SDK and the platform: HTTP at ``EMBER_URL``.

Handles build typed requests (:class:`Op`) and send them through a :class:`Transport` (blocking) or an
:class:`AsyncTransport` (async code). Transport exceptions never leave this module: they become
Ember's own errors, ``raise ... from``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar
from urllib.parse import quote

import msgspec

from ember._credentials import platform_token, platform_url
from ember._errors import DeadlineExceededError, EmberError, PlatformUnreachableError
from ember.wire import (
    HTTP_TIMEOUT_HEADER,
    CallRecord,
    DeadLetter,
    ErrorBody,
    ReplayReply,
    SpawnReply,
    encoder,
    error_from_info,
)
from ember.wire.streams import line_decoder

if TYPE_CHECKING:
    import ssl

    import httpx

IDEMPOTENCY_HEADER = "Idempotency-Key"
_LONG_POLL_MARGIN_S = 30.0  # a long poll's HTTP read timeout exceeds its wait by this much
_error_decoder = msgspec.json.Decoder(ErrorBody)
_spawn_decoder = msgspec.json.Decoder(SpawnReply)
_record_decoder = msgspec.json.Decoder(CallRecord)
_dead_decoder = msgspec.json.Decoder(list[DeadLetter])
_replay_decoder = msgspec.json.Decoder(ReplayReply)
T = TypeVar("T")


@dataclass(frozen=True)
class Op(Generic[T]):
    """One request to the platform and how to read its answer; either transport sends it."""

    method: str
    path: str
    decode: Callable[[bytes], T]
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    read_timeout_s: float | None = None  # None: the transport's default


class RawBody(bytes):
    """A call's body that is its one ``bytes`` argument itself, sent as ``application/octet-stream`` (no base64)."""


class RawOutput(bytes):
    """A call's result that came as ``application/octet-stream``: the ``bytes`` the function returned."""


def invoke_op(app: str, name: str, body: bytes, *, timeout_s: float | None = None) -> Op[bytes]:
    """``POST /v1/<app>/<name>``: a synchronous call; answers the result as raw JSON (or as a ``RawOutput``, for a
    ``RawBody`` whose function returns bytes)."""
    headers = _call_headers(timeout_s, body)
    headers.setdefault("accept", "application/json")  # a generator's items then come as one list
    return Op("POST", f"/v1/{app}/{name}", _as_is, content=body, headers=headers)


def _as_is(content: bytes) -> bytes:
    return content  # a RawOutput stays one


def stream_op(app: str, name: str, body: bytes, *, timeout_s: float | None = None) -> Op[bytes]:
    """``POST /v1/<app>/<name>`` of a streaming (generator) function, read as NDJSON: see ``stream_items``."""
    headers = {**_call_headers(timeout_s, body), "accept": "application/x-ndjson"}
    return Op("POST", f"/v1/{app}/{name}", _as_is, content=body, headers=headers)


def _item_of(line: bytes | str, what: str) -> bytes | None:
    """The raw JSON of the item one NDJSON line carries; None at the stream's end; the error a line carries, raised."""
    try:
        parsed = line_decoder.decode(line)
    except msgspec.MsgspecError as exc:
        raise EmberError(f"{what}: an unreadable line in the stream: {str(line)[:200]!r}") from exc
    if parsed.error is not None:
        raise error_from_info(parsed.error)
    if parsed.end:
        return None
    if isinstance(parsed.item, msgspec.Raw):
        return bytes(parsed.item)
    raise EmberError(f"{what}: a line in the stream is neither an item, its end nor an error: {str(line)[:200]!r}")


def _cut(what: str) -> PlatformUnreachableError:
    return PlatformUnreachableError(f"{what}: the stream was cut before its end")


def spawn_op(app: str, name: str, body: bytes, *, timeout_s: float | None = None,
             idempotency_key: str | None = None) -> Op[SpawnReply]:
    """``POST /v1/<app>/<name>/spawn``: queue a call; answers its id."""
    headers = _call_headers(timeout_s, body)
    if idempotency_key is not None:
        headers[IDEMPOTENCY_HEADER] = idempotency_key
    return Op("POST", f"/v1/{app}/{name}/spawn", _spawn_decoder.decode, content=body, headers=headers)


def record_op(call_id: str, *, wait_s: float = 0.0) -> Op[CallRecord]:
    """``GET /v1/calls/<id>``, long-polling up to ``wait_s`` seconds for a final status."""
    if wait_s <= 0:
        return Op("GET", _call_path(call_id), _record_decoder.decode)
    return Op("GET", _call_path(call_id), _record_decoder.decode, params={"wait": f"{wait_s:.3f}"},
              read_timeout_s=wait_s + _LONG_POLL_MARGIN_S)


def cancel_op(call_id: str, *, terminate: bool = False) -> Op[CallRecord]:
    """``DELETE /v1/calls/<id>[?terminate=true]``: cancel a queued or running call (``ConflictError`` once it
    finished)."""
    params = {"terminate": "true"} if terminate else {}
    return Op("DELETE", _call_path(call_id), _record_decoder.decode, params=params)


def dead_letters_op(app: str, name: str) -> Op[list[DeadLetter]]:
    """``GET /v1/apps/<app>/dead?function=<name>``."""
    return Op("GET", f"/v1/apps/{app}/dead", _dead_decoder.decode, params={"function": name})


def replay_op(app: str, name: str, call_ids: list[str] | None = None) -> Op[ReplayReply]:
    """``POST /v1/apps/<app>/dead/replay``: resubmit dead letters (all of the function's when no ids)."""
    body: dict[str, Any] = {"function": name}
    if call_ids is not None:
        body["call_ids"] = call_ids
    return Op("POST", f"/v1/apps/{app}/dead/replay", _replay_decoder.decode, content=encoder.encode(body),
              headers={"content-type": "application/json"})


def _call_headers(timeout_s: float | None, body: bytes = b"") -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if isinstance(body, RawBody):
        headers = {"content-type": "application/octet-stream", "accept": "application/octet-stream, application/json"}
    if timeout_s is not None:
        headers[HTTP_TIMEOUT_HEADER] = str(timeout_s)
    return headers


def _call_path(call_id: str) -> str:
    return f"/v1/calls/{quote(call_id, safe='')}"


class Transport:
    """Speaks the platform's HTTP API; thread-safe, one connection pool per instance.

    ``token`` is sent as ``Authorization: Bearer``; by default ``EMBER_TOKEN``, else the one ``ember login`` saved
    for ``url``; "" sends none.
    """

    def __init__(self, url: str | None = None, *, token: str | None = None, timeout_s: float = 300.0) -> None:
        import httpx

        self.url = (url or platform_url()).rstrip("/")
        self.token = token if token is not None else (platform_token(self.url) or "")
        self._client = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=5.0),
                                    verify=ssl_context(), headers=_auth_headers(self.token),
                                    limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    def close(self) -> None:
        self._client.close()

    def invoke(self, app: str, name: str, body: bytes, *, timeout_s: float | None = None) -> bytes:
        """Call ``app.name`` with a JSON body; returns the result as raw JSON."""
        return self.send(invoke_op(app, name, body, timeout_s=timeout_s))

    def send(self, op: Op[T]) -> T:
        """Send one typed request; a non-2xx answer raises the matching EmberError."""
        return op.decode(_content(self.request(op.method, op.path, **_request_kwargs(op))))

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """An HTTP request to the platform; a non-2xx answer raises the matching EmberError."""
        with _mapped_errors(self.url, method, path):
            response = self._client.request(method, path, **kwargs)
        return _checked(response)

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return msgspec.json.decode(self.request(method, path, **kwargs).content)

    @contextlib.contextmanager
    def stream(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """A request whose answer is read as it comes (``response.iter_lines()``); a non-2xx answer raises the
        matching EmberError before the body is handed over."""
        with _mapped_errors(self.url, method, path), self._client.stream(method, path, **kwargs) as response:
            if response.status_code >= 400:
                response.read()
                raise _error_from(response)
            yield response

    def answer_parts(self, op: Op[bytes]) -> Iterator[tuple[bool, bytes]]:
        """What a call answers, as it comes: ``(False, result)`` once for a plain function; ``(True, item)`` per item
        for a generator (``op`` should accept NDJSON: see ``stream_op``)."""
        what = f"{op.method} {self.url}{op.path}"
        with self.stream(op.method, op.path, **_request_kwargs(op)) as response, \
                _mapped_errors(self.url, op.method, op.path):
            if response.headers.get("content-type", "").partition(";")[0] != "application/x-ndjson":
                yield False, response.read()
                return
            for line in response.iter_lines():
                if line:
                    item = _item_of(line, what)
                    if item is None:
                        return
                    yield True, item
        raise _cut(what)

    def stream_items(self, op: Op[bytes]) -> Iterator[bytes]:
        """The raw JSON items of a streamed call (``stream_op``) as they come; raises the error it ended with."""
        what = f"{op.method} {self.url}{op.path}"
        with self.stream(op.method, op.path, **_request_kwargs(op)) as response:  # transport errors mapped
            for line in response.iter_lines():
                if line:
                    item = _item_of(line, what)
                    if item is None:
                        return
                    yield item
        raise _cut(what)


class AsyncTransport:
    """The async twin of :class:`Transport`, owned by one operation: ``async with AsyncTransport() as t``.

    An ``httpx.AsyncClient`` belongs to the event loop it first runs on, so each async operation (one
    ``.remote.aio`` call, one whole ``.map.aio`` stream) opens its own and closes it when done.
    """

    def __init__(self, url: str | None = None, *, token: str | None = None, timeout_s: float = 300.0) -> None:
        import httpx

        self.url = (url or platform_url()).rstrip("/")
        self.token = token if token is not None else (platform_token(self.url) or "")
        self._client = httpx.AsyncClient(
            base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=5.0), verify=ssl_context(),
            headers=_auth_headers(self.token),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    @classmethod
    def like(cls, transport: Transport | None) -> AsyncTransport:
        """An async transport to the platform and with the token of ``transport`` (the defaults when None: inside a
        replica, its own transport over NATS)."""
        if transport is None and inner is not None:
            return inner.aio()
        return cls(transport.url, token=transport.token) if transport is not None else cls()

    async def __aenter__(self) -> AsyncTransport:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def send(self, op: Op[T]) -> T:
        """Send one typed request; a non-2xx answer raises the matching EmberError."""
        return op.decode(_content(await self.request(op.method, op.path, **_request_kwargs(op))))

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """An HTTP request to the platform; a non-2xx answer raises the matching EmberError."""
        with _mapped_errors(self.url, method, path):
            response = await self._client.request(method, path, **kwargs)
        return _checked(response)

    async def stream_items(self, op: Op[bytes]) -> AsyncIterator[bytes]:
        """The async twin of :meth:`Transport.stream_items`."""
        what = f"{op.method} {self.url}{op.path}"
        with _mapped_errors(self.url, op.method, op.path):
            async with self._client.stream(op.method, op.path, **_request_kwargs(op)) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise _error_from(response)
                async for line in response.aiter_lines():
                    if line:
                        item = _item_of(line, what)
                        if item is None:
                            return
                        yield item
        raise _cut(what)


def _content(response: httpx.Response) -> bytes:
    """The answer's body; marked as a ``RawOutput`` when it is raw bytes, not JSON."""
    if response.headers.get("content-type") == "application/octet-stream":
        return RawOutput(response.content)
    return response.content


def _auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """The TLS settings every HTTP client of this process shares (httpx's own: certifi's CA bundle, or
    ``SSL_CERT_FILE``/``SSL_CERT_DIR``). Building one reads the whole CA bundle (30-90 ms of CPU), which an
    ``httpx.Client`` left to itself does on every construction."""
    import httpx

    return httpx.create_ssl_context()


def _request_kwargs(op: Op[Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"headers": op.headers, "params": op.params}
    if op.content is not None:
        kwargs["content"] = op.content
    if op.read_timeout_s is not None:
        import httpx

        kwargs["timeout"] = httpx.Timeout(op.read_timeout_s, connect=5.0)
    return kwargs


@contextlib.contextmanager
def _mapped_errors(url: str, method: str, path: str) -> Iterator[None]:
    import httpx

    try:
        yield
    except httpx.TimeoutException as exc:
        raise DeadlineExceededError(f"{method} {url}{path} timed out") from exc
    except httpx.TransportError as exc:
        raise PlatformUnreachableError(
            f"cannot reach the Ember platform at {url} ({exc}); is `ember dev` running, "
            "or EMBER_URL set?") from exc


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        raise _error_from(response)
    return response


def _error_from(response: httpx.Response) -> EmberError:
    try:
        info = _error_decoder.decode(response.content).error
    except msgspec.MsgspecError:
        return EmberError(f"HTTP {response.status_code}: {response.text[:500]}")
    return error_from_info(info)


_transports: dict[tuple[str, str], Transport] = {}
_lock = threading.Lock()


@atexit.register
def _close_transports() -> None:
    with _lock:
        for transport in _transports.values():
            transport.close()
        _transports.clear()


class InnerTransports(Protocol):
    """The transports of code running inside a replica (``ember._inner``): over its NATS connection, not HTTP."""

    def sync(self) -> Transport: ...

    def aio(self) -> AsyncTransport: ...


inner: InnerTransports | None = None  # set by the replica that runs this process (``ember._inner.install``)


def default_transport() -> Transport:
    """The shared transport for the current ``EMBER_URL`` and token; inside a replica, its own over NATS."""
    if inner is not None:
        return inner.sync()
    url = platform_url()
    key = (url, platform_token(url) or "")
    with _lock:
        if key not in _transports:
            _transports[key] = Transport(url, token=key[1])
        return _transports[key]
