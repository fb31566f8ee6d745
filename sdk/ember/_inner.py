"""Calls from inside a replica: a function that calls another goes over its replica's NATS connection, not HTTP.

The replica process installs a :class:`Relay` (its NATS connection and event loop) with :func:`install`; from then
on the handles' default transports (``ember._client.default_transport``, ``AsyncTransport.like(None)``) are the ones
here. They turn each request the handles build (an ``Op``) into a relay request (``ember.wire.relay``) sent on the
replica's own relay subject, stamped with the call being served (:func:`current_call`): its deadline, which the
callee may not exceed, and the chain of calls waiting on it, by which the control plane refuses a cycle.

Blocking verbs (``other.remote(x)`` in a sync function, on the model thread) wait for the answer on that thread
while the replica's event loop goes on; the ``.aio`` forms await it on whatever loop runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote

import msgspec

from ember import _client
from ember._client import AsyncTransport, Op, Transport
from ember._errors import BadRequestError, CallCancelledError, DeadlineExceededError, EmberError
from ember.wire import HTTP_TIMEOUT_HEADER, error_from_info
from ember.wire.calls import Hop
from ember.wire.relay import RelayCancel, RelayInvoke, RelayRecord, RelayReply, RelayRequest, RelaySpawn

T = TypeVar("T")
_list_of_raw = msgspec.json.Decoder(list[msgspec.Raw])
REPLY_MARGIN_S = 5.0  # how much longer than the call's deadline the caller waits for the control plane's answer
NO_DEADLINE_WAIT_S = 24 * 3600.0  # a call with no deadline of its own: the target's timeout_s ends it sooner
SUBMIT_WAIT_S = 30.0  # spawn and cancel; a record's long poll waits this much beyond its wait


@dataclass(frozen=True)
class CallContext:
    """The call a function is serving now, as :func:`ember.current_call` returns it.

    Attributes:
        app: the app of the function serving the call.
        function: the function's name (``"Class.method"`` for a method).
        call_id: the call's id (for a batch, that of its first call).
        call_ids: for a batch, the ids of all the calls it serves, ``call_id`` first (empty: ``call_id`` alone).
        deadline: when the caller stops waiting, in seconds since the epoch (``math.inf``: never); the functions
            it calls get no more time than this.
        chain: the calls waiting on this one when a function called it, outermost first (empty for a call from
            outside).
        cancelled: set once the call is cancelled while it runs (for a batch: once all its calls are). Sync code
            that runs long may poll it (``if call.cancelled.is_set(): return``) and stop early; whatever it then
            returns is dropped, and a function it calls from then on raises ``CallCancelledError`` (never sent). An
            ``async def`` function is cancelled where it awaits instead, and a generator closed at its next item.
    """

    app: str
    function: str
    call_id: str
    deadline: float
    chain: tuple[Hop, ...] = ()
    cancelled: threading.Event = field(default_factory=threading.Event)
    call_ids: tuple[str, ...] = ()

    def remaining_s(self) -> float:
        """Seconds left before the deadline (``math.inf`` without one)."""
        return self.deadline - time.time() if math.isfinite(self.deadline) else math.inf


_CURRENT: ContextVar[CallContext | None] = ContextVar("ember_current_call", default=None)


def current_call() -> CallContext | None:
    """The call this code is serving inside a replica (``None`` elsewhere, and in setup).

    Example:
        >>> @app.function()
        ... def slow(x: int) -> int:
        ...     call = ember.current_call()
        ...     if call is not None and call.remaining_s() < 1.0:
        ...         raise RuntimeError("not enough time left")
    """
    return _CURRENT.get()


@contextlib.contextmanager
def serving(call: CallContext | None) -> Iterator[None]:
    """Run the block as serving ``call`` (the replica wraps each batch in it)."""
    token = _CURRENT.set(call)
    try:
        yield
    finally:
        _CURRENT.reset(token)


class Relay(Protocol):
    """What the replica provides: its event loop and a request over its NATS connection."""

    loop: asyncio.AbstractEventLoop

    async def request(self, request: RelayRequest, wait_s: float) -> RelayReply:
        """Send ``request`` on the replica's relay subject; raise an ``EmberError`` if no answer in ``wait_s``."""
        ...


class _Installed:
    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    def sync(self) -> Transport:
        return RelayTransport(self.relay, current_call())

    def aio(self) -> AsyncTransport:
        return AsyncRelayTransport(self.relay, current_call())


def install(relay: Relay) -> None:
    """From now on, this process's handles call through ``relay`` (a replica, once connected)."""
    _client.inner = _Installed(relay)


def uninstall() -> None:
    _client.inner = None


class RelayTransport(Transport):
    """The blocking transport of code inside a replica, bound to the call it serves."""

    def __init__(self, relay: Relay, caller: CallContext | None) -> None:  # no HTTP client: no super().__init__
        self.url = "nats:relay"
        self.token = ""
        self._relay = relay
        self._caller = caller

    def close(self) -> None:
        pass

    def send(self, op: Op[T]) -> T:
        request, wait_s = relay_request(op, self._caller)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._relay.loop:
            raise EmberError("a blocking call (.remote(), .spawn(), .get(), .map()) on the replica's event loop would "
                             "stop it: in async code, await the .aio form (await fn.remote.aio(x))")
        future = asyncio.run_coroutine_threadsafe(self._relay.request(request, wait_s), self._relay.loop)
        try:
            reply = future.result(wait_s + REPLY_MARGIN_S)
        except TimeoutError:
            if future.done():  # the request's own error (a DeadlineExceededError is a TimeoutError too)
                raise
            future.cancel()
            raise DeadlineExceededError(f"no answer from the platform within {wait_s:g}s") from None
        return _decoded(op, reply)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        raise EmberError(f"{method} {path}: inside a replica, only calls of functions go to the platform")

    def stream_items(self, op: Op[bytes]) -> Iterator[bytes]:
        """A generator function's items: between functions, they come once its call has finished (one list)."""
        yield from _items(self.send(op))


class AsyncRelayTransport(AsyncTransport):
    """The async transport of code inside a replica, bound to the call it serves."""

    def __init__(self, relay: Relay, caller: CallContext | None) -> None:  # no HTTP client: no super().__init__
        self.url = "nats:relay"
        self.token = ""
        self._relay = relay
        self._caller = caller

    async def __aenter__(self) -> AsyncRelayTransport:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        pass

    async def aclose(self) -> None:
        pass

    async def send(self, op: Op[T]) -> T:
        request, wait_s = relay_request(op, self._caller)
        return _decoded(op, await self._on_relay_loop(self._relay.request(request, wait_s)))

    async def _on_relay_loop(self, work: Coroutine[Any, Any, RelayReply]) -> RelayReply:
        if asyncio.get_running_loop() is self._relay.loop:
            return await work
        # Another loop (a user's own, in a thread): the NATS connection belongs to the replica's.
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._relay.loop))

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        raise EmberError(f"{method} {path}: inside a replica, only calls of functions go to the platform")

    async def stream_items(self, op: Op[bytes]) -> AsyncIterator[bytes]:
        """The async twin of :meth:`RelayTransport.stream_items`."""
        for item in _items(await self.send(op)):
            yield item


def _items(collected: bytes) -> list[bytes]:
    try:
        return [bytes(item) for item in _list_of_raw.decode(collected)]
    except msgspec.DecodeError as exc:
        raise EmberError(f"a generator function's call answered no list of items: {exc}") from None


def relay_request(op: Op[Any], caller: CallContext | None) -> tuple[RelayRequest, float]:
    """The relay request for one of the handles' ops, and how long to wait for its answer."""
    parts = [unquote(p) for p in op.path.strip("/").split("/")]
    if op.content is not None and op.headers.get("content-type", "application/json") != "application/json":
        raise BadRequestError(f"{op.method} {op.path}: between functions, inputs travel as JSON; a raw "
                              f"{op.headers.get('content-type')} body cannot", field="$body")
    timeout_s = _timeout(op)
    if op.method == "POST" and len(parts) == 3 and parts[0] == "v1":
        return _invoke(parts[1], parts[2], op, caller, timeout_s)
    if op.method == "POST" and len(parts) == 4 and parts[0] == "v1" and parts[3] == "spawn":
        _refuse_if_cancelled(caller, f"{parts[1]}.{parts[2]}")
        key = op.headers.get(_client.IDEMPOTENCY_HEADER)
        return RelaySpawn(app=parts[1], function=parts[2], input=msgspec.Raw(op.content or b"null"),
                          timeout_s=timeout_s, idempotency_key=key,
                          caller_call_ids=list(caller.call_ids or [caller.call_id]) if caller is not None else []
                          ), SUBMIT_WAIT_S
    if len(parts) == 3 and parts[:2] == ["v1", "calls"] and op.method == "GET":
        wait_s = float(op.params.get("wait", 0))
        return RelayRecord(call_id=parts[2], wait_s=wait_s), wait_s + SUBMIT_WAIT_S
    if len(parts) == 3 and parts[:2] == ["v1", "calls"] and op.method == "DELETE":
        return RelayCancel(call_id=parts[2]), SUBMIT_WAIT_S
    raise EmberError(f"{op.method} {op.path}: inside a replica, only calls of functions go to the platform")


def _invoke(app: str, function: str, op: Op[Any], caller: CallContext | None,
            timeout_s: float | None) -> tuple[RelayRequest, float]:
    _refuse_if_cancelled(caller, f"{app}.{function}")
    deadline = caller.deadline if caller is not None else math.inf
    if timeout_s is not None:
        deadline = min(deadline, time.time() + timeout_s)
    left = deadline - time.time()
    if left <= 0:
        raise DeadlineExceededError(f"no time is left of this call's deadline to call {app}.{function}",
                                    call_id=caller.call_id if caller is not None else None)
    request = RelayInvoke(app=app, function=function, input=msgspec.Raw(op.content or b"null"),
                          deadline=deadline if math.isfinite(deadline) else 0.0,
                          caller_function=caller.function if caller is not None else "",
                          caller_call_id=caller.call_id if caller is not None else "",
                          chain=list(caller.chain) if caller is not None else [],
                          caller_call_ids=list(caller.call_ids) if caller is not None and len(caller.call_ids) > 1
                          else [])
    return request, left if math.isfinite(left) else NO_DEADLINE_WAIT_S


def _refuse_if_cancelled(caller: CallContext | None, target: str) -> None:
    """A cancelled call's result is dropped: it makes no more calls, spawned ones included (the work it would
    start is work its caller gave up)."""
    if caller is not None and caller.cancelled.is_set():
        raise CallCancelledError(f"this call was cancelled: it makes no more calls (of {target})",
                                 call_id=caller.call_id)


def _timeout(op: Op[Any]) -> float | None:
    raw = op.headers.get(HTTP_TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise BadRequestError(f"{HTTP_TIMEOUT_HEADER}={raw!r} is not a number of seconds") from None


def _decoded(op: Op[T], reply: RelayReply) -> T:
    if reply.error is not None:
        error = error_from_info(reply.error)
        # Named as raised in this function's code: if it lets the error out, its own caller's router then knows
        # that the function ran (an ``unavailable`` with no type means a replica that never ran the call).
        error.remote_type = error.remote_type or type(error).__name__
        raise error
    return op.decode(bytes(reply.output))
