"""Handles: the verbs a user calls on a deployed function (``.remote``, ``.map``, ``.local``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, ParamSpec, TypeVar

import msgspec

from ember._client import Transport, default_transport
from ember._types import CallIO

P = ParamSpec("P")
R = TypeVar("R")


class FunctionHandle:
    """A deployed function or method, called through the platform at ``EMBER_URL``.

    Example:
        >>> greet = ember.lookup("hello", "greet")
        >>> greet.remote("Ada")
        'Hello, Ada!'
    """

    def __init__(self, app: str, name: str, io: CallIO | None = None, transport: Transport | None = None):
        self.app_name = app
        self.function_name = name
        self._io = io
        self._transport = transport

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.app_name}.{self.function_name}>"

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function on a replica and return its result (typed when the handle knows the type).

        Raises:
            ember.EmberError: a subclass naming what went wrong (invalid input, unavailable, ...).
        """
        raw = self._call(self._encode(args, kwargs))
        return self._io.decode_output(raw) if self._io else msgspec.json.decode(raw)

    def map(self, inputs: Iterable[Any], *, max_concurrency: int = 32) -> Iterator[Any]:
        """Call the function once per input, concurrently, yielding results in input order.

        Each input is the function's single argument (or a dict of keyword arguments when it takes
        several). The first failing call raises its error when its turn comes.
        """
        with ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="ember-map") as pool:
            futures = [pool.submit(self._call_one, x) for x in inputs]
            for future in futures:
                yield future.result()

    def _call_one(self, x: Any) -> Any:
        if self._io is not None and self._io.mode == "kwargs":
            return self.remote(**x)
        return self.remote(x)

    def _encode(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        if self._io is not None:
            return self._io.encode_args(args, kwargs)
        if (args and kwargs) or len(args) > 1:
            raise TypeError("pass one positional input, or keyword arguments")
        return msgspec.json.encode(args[0] if args else kwargs)

    def _call(self, body: bytes) -> bytes:
        transport = self._transport or default_transport()
        return transport.invoke(self.app_name, self.function_name, body)


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
    from ember._app import run_setup

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
