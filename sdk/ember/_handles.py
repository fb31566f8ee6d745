"""Handles: the verbs a user calls on a deployed function (``.remote``, ``.spawn``, ``.map``, ``.local``)."""

from __future__ import annotations

import copy
from collections.abc import AsyncGenerator, Callable, Generator, Iterable
from contextlib import aclosing, closing
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, Self, TypeVar

import msgspec

from ember import _client
from ember._client import (
    AsyncTransport,
    Op,
    RawBody,
    Transport,
    dead_letters_op,
    default_transport,
    invoke_op,
    replay_op,
    spawn_op,
    stream_op,
)
from ember._function_call import FunctionCall, astream, check_concurrency, decode_output, stream, verb
from ember._setup import run_setup
from ember._types import CallIO
from ember.wire import DeadLetter, SpawnReply
from ember.wire.codec import json_args_encoder

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class _Options:
    timeout_s: float | None = None
    idempotency_key: str | None = None


class FunctionHandle:
    """A deployed function or method, called through the platform at ``EMBER_URL``.

    Every verb that calls the platform also has an async form: ``await greet.remote.aio("Ada")``.

    Example:
        >>> greet = ember.lookup("hello", "greet")
        >>> greet.remote("Ada")
        'Hello, Ada!'
        >>> greet.spawn("Ada").get(timeout=60)
        'Hello, Ada!'
    """

    def __init__(self, app: str, name: str, io: CallIO | None = None, transport: Transport | None = None):
        self.app_name = app
        self.function_name = name
        self._io = io
        self._transport = transport
        self._options = _Options()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.app_name}.{self.function_name}>"

    def with_options(self, *, timeout_s: float | None = None, idempotency_key: str | None = None) -> Self:
        """A copy of this handle whose calls carry these options (options left ``None`` are kept).

        Options are set here, not as keyword arguments of the verbs, so that they never collide with
        the function's own parameters.

        Args:
            timeout_s: the call's deadline in seconds, capped by the function's ``timeout_s``. For
                ``.spawn()`` it counts from the submit, time in the queue included: a call still
                queued then never runs and ends ``expired``.
            idempotency_key: ``.spawn()`` only: submits with the same key return the same call id
                and the call runs once (retry a submit safely). ``.remote()`` and ``.map()`` refuse it.

        Example:
            >>> resize.with_options(idempotency_key=f"order-{order_id}", timeout_s=600).spawn(image)
            >>> greet.with_options(timeout_s=2).remote("Ada")
        """
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float)
                                      or not 0 < timeout_s < float("inf")):
            raise ValueError(f"timeout_s={timeout_s!r}: give a positive number of seconds")
        if idempotency_key is not None and (not isinstance(idempotency_key, str) or not idempotency_key):
            raise ValueError(f"idempotency_key={idempotency_key!r}: give a non-empty string")
        clone = copy.copy(self)
        old = self._options
        clone._options = _Options(timeout_s=old.timeout_s if timeout_s is None else timeout_s,
                                  idempotency_key=old.idempotency_key if idempotency_key is None else idempotency_key)
        return clone

    async def _remote_aio(self, *args: Any, **kwargs: Any) -> Any:
        op = self._invoke_op(self._encode(args, kwargs))
        async with self._async_transport() as transport:
            return decode_output(self._io, await transport.send(op))

    @verb(_remote_aio)
    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function on a replica and return its result (typed when the handle knows the type).

        Raises:
            ember.EmberError: a subclass naming what went wrong (invalid input, unavailable, ...).

        Example:
            >>> greet.remote("Ada")
            'Hello, Ada!'
            >>> await greet.remote.aio("Ada")   # in async code
        """
        op = self._invoke_op(self._encode(args, kwargs))
        return decode_output(self._io, self._sync_transport().send(op))

    def _remote_gen_aio(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        return self._agen(self._stream_op(self._encode(args, kwargs)))

    async def _agen(self, op: Op[bytes]) -> AsyncGenerator[Any, None]:
        async with self._async_transport() as transport, aclosing(_stream_items(transport, op)) as items:
            async for raw in items:
                yield decode_item(self._io, raw)

    @verb(_remote_gen_aio)
    def remote_gen(self, *args: Any, **kwargs: Any) -> Generator[Any, None, None]:
        """Call a generator function and iterate over its items as the replica yields them.

        The call starts on the first ``next()``. Leaving the loop early (``break``, an exception, closing the
        generator) hangs up, and the platform closes the function's generator: its ``finally`` runs. An error
        raised by the function after some items is raised here after them.

        Example:
            >>> for token in generate.remote_gen("Once upon a time"):
            ...     print(token, end="", flush=True)
            >>> async for token in generate.remote_gen.aio("Once"): ...   # in async code
        """
        op = self._stream_op(self._encode(args, kwargs))
        return self._gen(op)

    def _gen(self, op: Op[bytes]) -> Generator[Any, None, None]:
        with closing(_stream_items(self._sync_transport(), op)) as items:
            for raw in items:
                yield decode_item(self._io, raw)

    async def _spawn_aio(self, *args: Any, **kwargs: Any) -> FunctionCall:
        op = self._spawn_op(self._encode(args, kwargs))
        async with self._async_transport() as transport:
            return self._spawned(await transport.send(op))

    @verb(_spawn_aio)
    def spawn(self, *args: Any, **kwargs: Any) -> FunctionCall:
        """Queue a call durably and return at once with a :class:`FunctionCall` on it.

        The platform validates the input first (an invalid one raises here, like ``.remote()``);
        the call then runs at least once, from the function's queue, even if this process exits.
        Set a deadline or an idempotency key with :meth:`with_options`.

        Example:
            >>> call = greet.spawn("Ada")
            >>> call.get(timeout=60)
            'Hello, Ada!'
            >>> call = await greet.spawn.aio("Ada")   # in async code
        """
        return self._spawned(self._sync_transport().send(self._spawn_op(self._encode(args, kwargs))))

    def _map_aio(self, inputs: Iterable[Any], *, max_concurrency: int = 32,
                 order: bool = True) -> AsyncGenerator[Any, None]:
        self._invoke_op(b"")  # refuses an idempotency key before any call
        check_concurrency(max_concurrency)
        return self._amap(inputs, max_concurrency, order)

    async def _amap(self, inputs: Iterable[Any], max_concurrency: int, order: bool) -> AsyncGenerator[Any, None]:
        async with self._async_transport() as transport:
            async def one(x: Any) -> Any:
                return decode_output(self._io, await transport.send(self._invoke_op(self._map_body(x))))

            async with aclosing(astream(one, inputs, max_concurrency=max_concurrency, order=order)) as results:
                async for result in results:
                    yield result

    @verb(_map_aio)
    def map(self, inputs: Iterable[Any], *, max_concurrency: int = 32,
            order: bool = True) -> Generator[Any, None, None]:
        """Call the function once per input, concurrently, streaming the results.

        Each input is the function's single argument (or a dict of keyword arguments when it takes
        several). Inputs are read lazily and at most ``max_concurrency`` calls are in flight (taken
        but not yet yielded), so a long or endless iterable is fine. ``order=True`` yields results in
        input order; ``order=False`` as they finish. The first failing call raises its error when its
        result would be yielded. Leaving the loop early cancels the calls not yet sent; the blocking
        form waits for those in flight, the async one cancels them (``contextlib.aclosing`` closes
        the stream at once).

        Example:
            >>> list(add.map([{"a": 1, "b": 2}, {"a": 3}]))
            [3, 3]
            >>> for label in predict.map(images, max_concurrency=8, order=False): ...
            >>> async for label in predict.map.aio(images): ...   # in async code
        """
        self._invoke_op(b"")  # refuses an idempotency key before any call
        transport = self._sync_transport()

        def one(x: Any) -> Any:
            return decode_output(self._io, transport.send(self._invoke_op(self._map_body(x))))

        return stream(one, inputs, max_concurrency=max_concurrency, order=order)

    def dead_letters(self) -> list[DeadLetter]:
        """Spawned calls of this function that failed their last attempt, with their errors and inputs.

        Example:
            >>> for letter in ember.lookup("hello", "greet").dead_letters():
            ...     print(letter.call_id, letter.attempts, letter.error.message)
        """
        return self._sync_transport().send(dead_letters_op(self.app_name, self.function_name))

    def replay(self, call_ids: Iterable[str] | None = None) -> list[FunctionCall]:
        """Resubmit dead letters (all of this function's when ``call_ids`` is ``None``) as new calls.

        Example:
            >>> calls = greet.replay()
            >>> [c.get(timeout=60) for c in calls]
        """
        ids = None if call_ids is None else list(call_ids)
        reply = self._sync_transport().send(replay_op(self.app_name, self.function_name, ids))
        return [FunctionCall(call_id, io=self._io, transport=self._transport) for call_id in reply.replayed]

    def _map_body(self, x: Any) -> bytes:
        if self._io is not None and self._io.mode == "kwargs":
            return self._encode((), x)
        return self._encode((x,), {})

    def _encode(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        one = args[0] if len(args) == 1 and not kwargs else None
        over_http = self._transport is not None or _client.inner is None  # inside a replica, calls go as JSON
        if isinstance(one, bytes | bytearray | memoryview) and (self._io is None or self._io.takes_bytes) and over_http:
            return RawBody(one)  # sent as it is, application/octet-stream
        if self._io is not None:
            return self._io.encode_args(args, kwargs)
        if (args and kwargs) or len(args) > 1:
            raise TypeError("pass one positional input, or keyword arguments")
        return json_args_encoder.encode(args[0] if args else kwargs)

    def _stream_op(self, body: bytes) -> Op[bytes]:
        if self._options.idempotency_key is not None:
            raise TypeError(f"{self!r} has an idempotency_key, which only .spawn() takes; "
                            "call .remote_gen() on a handle without one")
        if self._io is not None and not self._io.stream:
            raise TypeError(f"{self!r} is not a generator: call .remote() for its result")
        return stream_op(self.app_name, self.function_name, body, timeout_s=self._options.timeout_s)

    def _invoke_op(self, body: bytes) -> Op[bytes]:
        if self._options.idempotency_key is not None:
            raise TypeError(f"{self!r} has an idempotency_key, which only .spawn() takes; "
                            "call .remote() or .map() on a handle without one")
        if self._io is not None and self._io.stream:
            raise TypeError(f"{self!r} is a generator: iterate over .remote_gen(...) for its items as they come, "
                            "or .spawn(...).get() for the list of them")
        return invoke_op(self.app_name, self.function_name, body, timeout_s=self._options.timeout_s)

    def _spawn_op(self, body: bytes) -> Op[SpawnReply]:
        return spawn_op(self.app_name, self.function_name, body, timeout_s=self._options.timeout_s,
                        idempotency_key=self._options.idempotency_key)

    def _spawned(self, reply: SpawnReply) -> FunctionCall:
        return FunctionCall(reply.call_id, io=self._io, transport=self._transport)

    def _sync_transport(self) -> Transport:
        return self._transport or default_transport()

    def _async_transport(self) -> AsyncTransport:
        return AsyncTransport.like(self._transport)


def decode_item(io: CallIO | None, raw: bytes) -> Any:
    """One streamed item, as the generator's declared item type when the handle knows it."""
    return msgspec.json.decode(raw, type=io.output_type) if io is not None else msgspec.json.decode(raw)


def _stream_items(transport: Any, op: Op[bytes]) -> Any:
    items = getattr(transport, "stream_items", None)
    if items is None:
        raise TypeError(f"{type(transport).__name__} cannot stream a generator's items; call .spawn(...).get() for "
                        "the list of them")
    return items(op)


class Function(FunctionHandle, Generic[P, R]):
    """A function decorated with ``@app.function``; it keeps the original's signature."""

    def __init__(self, app: str, name: str, raw: Callable[P, R], io: CallIO) -> None:
        super().__init__(app, name, io)
        self.raw = raw
        self.cost: Callable[[Any], float] | None = None
        self.__wrapped__ = raw
        self.__name__ = raw.__name__
        self.__qualname__ = raw.__qualname__
        self.__doc__ = raw.__doc__
        self.__module__ = raw.__module__

    def local(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function in this process, as plain Python."""
        return self.raw(*args, **kwargs)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Refused: say where the call runs, with ``.remote()`` or ``.local()``."""
        raise TypeError(f"{self.__name__}(...) is ambiguous: call {self.__name__}.remote(...) to run it on Ember, "
                        f"or {self.__name__}.local(...) to run it in this process")


class MethodHandle(FunctionHandle):
    """A method of a class model: ``Classifier.predict.remote(x)``, or ``.local(x)`` in-process."""

    def __init__(self, app: str, name: str, raw: Callable[..., Any], io: CallIO, owner: type,
                 instance: Any = None) -> None:
        super().__init__(app, name, io)
        self.raw = raw
        self.__wrapped__ = raw
        self.__doc__ = raw.__doc__
        self._owner = owner
        self._instance = instance

    def local(self, *args: Any, **kwargs: Any) -> Any:
        """Run the method in this process; a class-level handle builds (and sets up) one instance."""
        instance = self._instance if self._instance is not None else _local_instance(self._owner)
        return self.raw(instance, *args, **kwargs)


_LOCAL_INSTANCES: dict[type, Any] = {}


def _local_instance(cls: type) -> Any:
    if cls not in _LOCAL_INSTANCES:
        instance = cls()
        run_setup(instance)
        _LOCAL_INSTANCES[cls] = instance
    return _LOCAL_INSTANCES[cls]


def lookup(app: str, name: str) -> FunctionHandle:
    """A handle on a deployed function, by app and function name (``"Class.method"`` for methods).

    Example:
        >>> predict = ember.lookup("digits", "Classifier.predict")
        >>> predict.remote({"pixels": [0.0] * 64})
    """
    return FunctionHandle(app, name)
