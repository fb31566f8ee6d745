"""Calls: the blocking-or-async verb pattern, spawned calls (:class:`FunctionCall`) and bounded streaming.

Every verb that does I/O has a blocking form and an ``.aio`` form for async code, from one
descriptor (:class:`Verb`): ``fn.remote(x)`` and ``await fn.remote.aio(x)``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

import msgspec

from ember._client import AsyncTransport, RawOutput, Transport, cancel_op, default_transport, record_op
from ember._errors import ConflictError, DeadlineExceededError
from ember._types import CallIO
from ember.wire import FINAL_STATUSES, CallRecord, CallStatus, ErrorInfo, error_from_info

S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")
A = TypeVar("A")
X = TypeVar("X")

POLL_S = 30.0  # one long poll's wait; .get() asks again until the call is final or its timeout passes


class Verb(Generic[S, P, R, A]):
    """A method with a blocking form and an ``.aio`` form for async code (see :func:`verb`)."""

    def __init__(self, sync: Callable[Concatenate[S, P], R], aio: Callable[Concatenate[S, P], A]) -> None:
        self._sync = sync
        self._aio = aio
        self.__doc__ = sync.__doc__
        self.__name__ = sync.__name__
        self.__qualname__ = sync.__qualname__
        self.__wrapped__ = sync

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Verb[S, P, R, A]: ...
    @overload
    def __get__(self, instance: S, owner: type[Any]) -> BoundVerb[P, R, A]: ...

    def __get__(self, instance: S | None, owner: type[Any]) -> Verb[S, P, R, A] | BoundVerb[P, R, A]:
        if instance is None:
            return self
        return BoundVerb(instance, self._sync, self._aio)


class BoundVerb(Generic[P, R, A]):
    """A verb of one handle: call it to block, or ``await verb.aio(...)`` (``async for`` for streams)."""

    def __init__(self, instance: Any, sync: Callable[Concatenate[Any, P], R],
                 aio: Callable[Concatenate[Any, P], A]) -> None:
        self._instance = instance
        self._sync = sync
        self._aio = aio
        self.__doc__ = sync.__doc__
        self.__name__ = sync.__name__

    def __repr__(self) -> str:
        return f"<verb {self.__name__} of {self._instance!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._sync(self._instance, *args, **kwargs)

    def aio(self, *args: P.args, **kwargs: P.kwargs) -> A:
        """The same verb for async code: ``await`` its result (``async for`` over a stream)."""
        return self._aio(self._instance, *args, **kwargs)


def verb(aio: Callable[Concatenate[S, P], A]) -> Callable[[Callable[Concatenate[S, P], R]], Verb[S, P, R, A]]:
    """Pair a blocking method with its async twin ``aio`` (same parameters) as one :class:`Verb`.

    Example:
        >>> class Handle:
        ...     async def _ping_aio(self) -> str: ...
        ...     @verb(_ping_aio)
        ...     def ping(self) -> str: ...
        >>> Handle().ping()               # blocks
        >>> await Handle().ping.aio()     # in async code
    """
    def pair(sync: Callable[Concatenate[S, P], R]) -> Verb[S, P, R, A]:
        return Verb(sync, aio)

    return pair


def decode_output(io: CallIO | None, raw: bytes) -> Any:
    """A call's JSON result, as the function's declared output type when the handle knows it (raw bytes as they
    came)."""
    if isinstance(raw, RawOutput):
        return bytes(raw)
    return io.decode_output(raw) if io is not None else msgspec.json.decode(raw)


class FunctionCall:
    """A call submitted with ``.spawn()``: it runs from the function's durable queue, and its result
    is kept on the platform until fetched with ``.get()``.

    Example:
        >>> call = ember.lookup("hello", "greet").spawn("Ada")
        >>> call.status()
        'queued'
        >>> call.get(timeout=60)
        'Hello, Ada!'
        >>> again = ember.FunctionCall.from_id(call.call_id)   # e.g. in another process
    """

    def __init__(self, call_id: str, *, io: CallIO | None = None, transport: Transport | None = None) -> None:
        self.call_id = call_id
        self._io = io
        self._transport = transport

    @classmethod
    def from_id(cls, call_id: str) -> FunctionCall:
        """A handle on a spawned call, by its id; no request is made until you use it.

        Its ``.get()`` returns the output as plain JSON values (no declared type is known).

        Example:
            >>> call = ember.FunctionCall.from_id("3f9c0a...")
            >>> call.get(timeout=10)
        """
        return cls(call_id)

    def __repr__(self) -> str:
        return f"<FunctionCall {self.call_id}>"

    async def _get_aio(self, timeout: float | None = None) -> Any:
        poll = _Poll(self.call_id, timeout)
        async with self._async_transport() as transport:
            while True:
                record = await transport.send(record_op(self.call_id, wait_s=poll.wait_s()))
                if record.status in FINAL_STATUSES:
                    return self._result(record)
                await asyncio.sleep(poll.pause_s(record))

    @verb(_get_aio)
    def get(self, timeout: float | None = None) -> Any:
        """Wait for the call to finish and return its output (typed as the function declares it).

        Long-polls the platform; ``timeout`` bounds the wait in seconds (``None``: until the call
        is final; ``0``: just look).

        Raises:
            ember.DeadlineExceededError: ``timeout`` passed while the call was still queued or running
                (the call goes on: ``.get()`` again later), or the call itself expired.
            ember.EmberError: the call failed (``ember.RemoteError`` when the function raised) or was
                cancelled.

        Example:
            >>> call.get(timeout=60)
            'Hello, Ada!'
            >>> await call.get.aio(timeout=60)
        """
        poll = _Poll(self.call_id, timeout)
        transport = self._sync_transport()
        while True:
            record = transport.send(record_op(self.call_id, wait_s=poll.wait_s()))
            if record.status in FINAL_STATUSES:
                return self._result(record)
            time.sleep(poll.pause_s(record))

    async def _status_aio(self) -> CallStatus:
        return (await self._record_aio()).status

    @verb(_status_aio)
    def status(self) -> CallStatus:
        """Where the call is now: ``queued``, ``running``, ``succeeded``, ``failed``, ``cancelled`` or ``expired``.

        Example:
            >>> call.status()
            'running'
        """
        return self.record().status

    async def _cancel_aio(self, *, terminate: bool = False) -> bool:
        async with self._async_transport() as transport:
            try:
                await transport.send(cancel_op(self.call_id, terminate=terminate))
            except ConflictError:
                return False
        return True

    @verb(_cancel_aio)
    def cancel(self, *, terminate: bool = False) -> bool:
        """Cancel the call, queued or running: ``True`` if cancelled, ``False`` if it had finished already.

        A queued call never runs. A running one is stopped: an ``async def`` function's task is cancelled, a
        generator closed at its next item, and sync code told through ``ember.current_call().cancelled``; with
        ``terminate=True`` its replica is also stopped and replaced (its other calls are retried elsewhere), for
        sync code that never looks. Its record says ``cancelled``, by whom and when; ``.get()`` raises
        ``ember.CallCancelledError``.

        Example:
            >>> if not call.cancel():
            ...     print("too late, it is", call.status())
        """
        try:
            self._sync_transport().send(cancel_op(self.call_id, terminate=terminate))
        except ConflictError:
            return False
        return True

    async def _record_aio(self, *, wait_s: float = 0.0) -> CallRecord:
        async with self._async_transport() as transport:
            return await transport.send(record_op(self.call_id, wait_s=wait_s))

    @verb(_record_aio)
    def record(self, *, wait_s: float = 0.0) -> CallRecord:
        """The call as the platform records it (status, attempts, raw output or error).

        ``wait_s`` long-polls: it answers once the call is final, or after ``wait_s`` seconds.

        Example:
            >>> call.record(wait_s=5).attempts
            1
        """
        return self._sync_transport().send(record_op(self.call_id, wait_s=wait_s))

    def _result(self, record: CallRecord) -> Any:
        if record.status == "succeeded":
            return decode_output(self._io, bytes(record.output))
        info = record.error or ErrorInfo(code="internal", message=f"call {self.call_id} {record.status}")
        error = error_from_info(info)
        error.call_id = error.call_id or self.call_id
        raise error

    def _sync_transport(self) -> Transport:
        return self._transport or default_transport()

    def _async_transport(self) -> AsyncTransport:
        return AsyncTransport.like(self._transport)


class _Poll:
    """When ``.get()`` asks again: long polls of up to ``POLL_S``, until ``timeout`` has passed."""

    def __init__(self, call_id: str, timeout: float | None) -> None:
        self.call_id = call_id
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        self._asked_at = 0.0
        self._wait = 0.0
        self._pause = 0.0

    def wait_s(self) -> float:
        """How long the next request may wait on the platform."""
        self._asked_at = time.monotonic()
        left = POLL_S if self.deadline is None else min(POLL_S, self.deadline - self._asked_at)
        self._wait = max(0.0, left)
        return self._wait

    def pause_s(self, record: CallRecord) -> float:
        """After an answer that is not final: the pause before asking again; raises once out of time."""
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            raise DeadlineExceededError(
                f"call {self.call_id} did not finish within {self.timeout:g}s: it is still {record.status} "
                "(call .get() again to keep waiting)", call_id=self.call_id)
        # A platform that answers before the wait is over (one that caps long polls) is not hammered.
        answered_early = now - self._asked_at < self._wait / 2
        self._pause = min(1.0, max(0.05, self._pause * 2)) if answered_early else 0.0
        return self._pause if self.deadline is None else min(self._pause, self.deadline - now)


def stream(run: Callable[[X], R], inputs: Iterable[X], *, max_concurrency: int,
           order: bool) -> Generator[R, None, None]:
    """``run`` over ``inputs`` in threads, with at most ``max_concurrency`` inputs taken and not yet yielded.

    Inputs are read lazily (an endless generator is fine). With ``order`` results come in input
    order, else as they finish; the first failure raises when it would be yielded. Closing the
    stream early cancels what has not started and waits for what runs.
    """
    check_concurrency(max_concurrency)
    return _stream(run, inputs, max_concurrency, order)


def _stream(run: Callable[[X], R], inputs: Iterable[X], limit: int, order: bool) -> Generator[R, None, None]:
    source = iter(inputs)
    pending: deque[Future[R]] = deque()
    pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="ember-map")
    try:
        pending.extend(pool.submit(run, x) for x in itertools.islice(source, limit))
        while pending:
            if not order:
                wait(pending, return_when=FIRST_COMPLETED)
            future = _take(pending, order)
            result = future.result()
            pending.extend(pool.submit(run, x) for x in itertools.islice(source, limit - len(pending)))
            yield result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def astream(run: Callable[[X], Coroutine[Any, Any, R]], inputs: Iterable[X], *, max_concurrency: int,
            order: bool) -> AsyncGenerator[R, None]:
    """The async :func:`stream`: ``run`` as tasks of this event loop, which it cancels when closed early."""
    check_concurrency(max_concurrency)
    return _astream(run, inputs, max_concurrency, order)


async def _astream(run: Callable[[X], Coroutine[Any, Any, R]], inputs: Iterable[X], max_concurrency: int,
                   order: bool) -> AsyncGenerator[R, None]:
    source = iter(inputs)
    pending: deque[asyncio.Task[R]] = deque()
    try:
        pending.extend(asyncio.create_task(run(x)) for x in itertools.islice(source, max_concurrency))
        while pending:
            await asyncio.wait([pending[0]] if order else pending, return_when=asyncio.FIRST_COMPLETED)
            result = _take(pending, order).result()
            pending.extend(asyncio.create_task(run(x))
                           for x in itertools.islice(source, max_concurrency - len(pending)))
            yield result
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def _take(pending: deque[Any], order: bool) -> Any:
    """The next result's future: the oldest, or (unordered) the oldest of those done."""
    if order:
        return pending.popleft()
    done = next(f for f in pending if f.done())
    pending.remove(done)
    return done


def check_concurrency(max_concurrency: int) -> None:
    """Refuse a ``max_concurrency`` that is not a positive int."""
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ValueError(f"max_concurrency={max_concurrency!r}: give a positive int")

