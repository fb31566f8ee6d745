"""Typed inputs and outputs, read from a function's annotations.

The same :class:`CallIO` encodes a call's arguments in the client, gives the JSON Schema the
platform validates requests against, and decodes the request in the replica. Where ``ember push`` imports an app
without its image's packages, an annotation that is or holds a stand-in for one (``ember._lenient``) is read as
``Any`` (a stand-in ``numpy.ndarray`` as an array): the node's import inside the image reads the real schema.
"""

from __future__ import annotations

import collections.abc
import inspect
import re
import sys
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from ember._errors import InvalidInputError, InvalidSpecError
from ember._tensor import Tensor, schema_of, tensor_of, to_array
from ember.wire import InputMode
from ember.wire.codec import json_args_encoder
from ember.wire.tensors import TensorSignature

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class CallIO:
    """How one function's calls are encoded and decoded.

    For a streaming function (a generator), ``output_type`` is the type of one item it yields, and a whole
    result (a queued call's, or a synchronous call's collected by the platform) is a list of them.
    """

    stream = False

    def __init__(self, mode: InputMode, input_type: Any, output_type: Any, params: list[str],
                 signature: inspect.Signature, tensors: dict[str, Tensor] | None = None,
                 output_tensor: Tensor | None = None) -> None:
        self.mode = mode
        self.tensors = tensors or {}  # array parameters (their annotation is numpy.ndarray) by name
        self.output_tensor = output_tensor
        self.input_type = input_type
        self.output_type = output_type
        self.params = params
        self.signature = signature
        # Pass a single input positionally unless it is keyword-only; several by keyword unless positional-only.
        kinds = {name: p.kind for name, p in signature.parameters.items()}
        self._positional = {name for name, kind in kinds.items()
                            if (kind in _POSITIONAL if mode == "single" else kind is inspect.Parameter.POSITIONAL_ONLY)}
        self._decoder = msgspec.json.Decoder(input_type) if mode != "none" else None
        self._packed = msgspec.msgpack.Decoder(input_type) if mode != "none" else None

    @classmethod
    def of(cls, fn: Callable[..., Any], *, batched: bool, is_method: bool) -> CallIO:
        """Read the call types of ``fn`` (a plain function, or a method with ``self``)."""
        io = cls._of(fn, batched=batched, is_method=is_method)
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            where = f"{fn.__qualname__}()"
            io.stream = True
            io.output_type = stream_item(where, io.output_type)
            # A generator of arrays: each item a tensor (a decoupled model of the Open Inference Protocol).
            io.output_tensor = _tensor_of(stream_item(where, typing.get_type_hints(fn, include_extras=True).get(
                "return", Any)))
            if io.output_tensor is not None:
                io.output_type = Any
        return io

    @classmethod
    def _of(cls, fn: Callable[..., Any], *, batched: bool, is_method: bool) -> CallIO:
        where = f"{fn.__qualname__}()"
        try:
            hints = {name: _known(hint) for name, hint in typing.get_type_hints(fn).items()}
            extras = typing.get_type_hints(fn, include_extras=True)
        except Exception as exc:
            raise InvalidSpecError(f"{where}: cannot resolve its type annotations: {exc}") from exc
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())[1 if is_method else 0:]
        sig = sig.replace(parameters=params)
        for p in params:
            if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise InvalidSpecError(f"{where}: *args and **kwargs cannot be typed inputs; name each parameter")
        out = hints.get("return", Any)
        if batched:
            return cls._batched(where, params, hints, extras, out, sig)
        output_tensor = _tensor_of(extras.get("return"))
        out = Any if output_tensor is not None else out
        tensors = {p.name: t for p in params if (t := _tensor_of(extras.get(p.name))) is not None}
        hints = {**hints, **dict.fromkeys(tensors, Any)}  # arrays are decoded as lists, then made arrays
        if not params:
            return cls("none", None, out, [], sig, output_tensor=output_tensor)
        if len(params) == 1:
            p = params[0]
            return cls("single", hints.get(p.name, Any), out, [p.name], sig, tensors, output_tensor)
        fields = [(p.name, hints.get(p.name, Any)) if p.default is inspect.Parameter.empty
                  else (p.name, hints.get(p.name, Any), p.default) for p in params]
        args_type = msgspec.defstruct(f"{fn.__name__}_args", fields, kw_only=True, forbid_unknown_fields=True)
        return cls("kwargs", args_type, out, [p.name for p in params], sig, tensors, output_tensor)

    @classmethod
    def _batched(cls, where: str, params: list[inspect.Parameter], hints: dict[str, Any], extras: dict[str, Any],
                 out: Any, sig: inspect.Signature) -> CallIO:
        if len(params) != 1:
            raise InvalidSpecError(
                f"{where}: a batched function takes exactly one parameter, a list of inputs "
                f"(e.g. `def f(xs: list[Image]) -> list[Label]`); it has {len(params)}")
        item = _list_item(hints.get(params[0].name, list[Any]))
        out_item = _list_item(out)
        if item is None or out_item is None:
            raise InvalidSpecError(
                f"{where}: a batched function is annotated `(xs: list[In]) -> list[Out]`; "
                "annotate both the parameter and the return as lists")
        tensor = _tensor_of(_list_item(extras.get(params[0].name)))
        output_tensor = _tensor_of(_list_item(extras.get("return")))
        return cls("single", Any if tensor else item, Any if output_tensor else out_item, [params[0].name], sig,
                   {params[0].name: tensor} if tensor else None, output_tensor)

    def input_schema(self) -> dict[str, Any]:
        if self.mode == "none":
            return {}
        schema = msgspec.json.schema(self.input_type)
        if self.mode == "single" and self.tensors:
            return schema_of(self.tensors[self.params[0]])
        if self.tensors:
            ref = schema.get("$ref", "").rsplit("/", 1)[-1]
            properties = schema.get("$defs", {}).get(ref, {}).get("properties", {})
            for name, tensor in self.tensors.items():
                properties[name] = schema_of(tensor)
        return schema

    def output_schema(self) -> dict[str, Any]:
        """The schema of its result (of one item, for a streaming function)."""
        if self.output_tensor is not None:
            return schema_of(self.output_tensor)
        return msgspec.json.schema(self.output_type)

    def tensor_signature(self) -> TensorSignature | None:
        """The tensors of a function whose parameters and result are all arrays (an Open Inference Protocol
        model); None for any other."""
        if not self.params or self.output_tensor is None or set(self.tensors) != set(self.params):
            return None
        return TensorSignature(inputs=[self.tensors[name].meta(name) for name in self.params],
                               outputs=[self.output_tensor.meta("output")])

    @property
    def takes_bytes(self) -> bool:
        """Its one input is ``bytes``: a call may send it as a raw body (``application/octet-stream``)."""
        return self.mode == "single" and self.input_type is bytes

    @property
    def returns_bytes(self) -> bool:
        return self.output_type is bytes

    def encode_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        """The HTTP body of a call made with Python arguments."""
        if self.mode == "none":
            if args or kwargs:
                raise TypeError("this function takes no arguments")
            return b"{}"
        if self.mode == "single":
            if len(args) + len(kwargs) != 1 or (kwargs and self.params[0] not in kwargs):
                raise TypeError(f"expected one argument, {self.params[0]!r}")
            return json_args_encoder.encode(args[0] if args else kwargs[self.params[0]])
        return json_args_encoder.encode(self.signature.bind(*args, **kwargs).arguments)

    def decode_input(self, body: bytes, codec: str = "json") -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Python arguments from a request body (replica side), JSON or msgpack."""
        if self.mode == "none":
            return (), {}
        assert self._decoder is not None and self._packed is not None
        value = _decode(self._decoder if codec == "json" else self._packed, body)
        if self.mode == "single":
            values = [self._array(self.params[0], value, "$")]
        else:
            values = [self._array(name, getattr(value, name), f"$.{name}") for name in self.params]
        args = tuple(v for name, v in zip(self.params, values, strict=True) if name in self._positional)
        kwargs = {name: v for name, v in zip(self.params, values, strict=True) if name not in self._positional}
        return args, kwargs

    def decode_item(self, body: bytes, codec: str = "json") -> Any:
        """One input of a batched function."""
        assert self._decoder is not None and self._packed is not None
        return self._array(self.params[0], _decode(self._decoder if codec == "json" else self._packed, body), "$")

    def _array(self, name: str, value: Any, field: str) -> Any:
        tensor = self.tensors.get(name)
        return value if tensor is None else to_array(value, tensor, field)

    def decode_output(self, raw: bytes) -> Any:
        """A whole result (a streaming function's: the list of its items)."""
        value = msgspec.json.decode(raw, type=list[self.output_type] if self.stream else self.output_type)  # type: ignore[name-defined]
        if self.output_tensor is not None:
            import numpy as np

            return np.asarray(value, dtype=self.output_tensor.dtype)
        return value


def _decode(decoder: msgspec.json.Decoder[Any] | msgspec.msgpack.Decoder[Any], body: bytes) -> Any:
    try:
        return decoder.decode(body or (b"null" if isinstance(decoder, msgspec.json.Decoder) else b"\xc0"))
    except msgspec.ValidationError as exc:
        raise invalid_input(exc) from exc
    except (msgspec.DecodeError, RecursionError) as exc:
        what = "JSON" if isinstance(decoder, msgspec.json.Decoder) else "msgpack"
        raise InvalidInputError(f"malformed {what}: {exc}") from exc


_FIELD_MESSAGE = re.compile(r"Object (?:missing required|contains unknown) field `(.+)`")


def invalid_input(exc: msgspec.ValidationError) -> InvalidInputError:
    """msgspec's "Expected `int`, got `str` - at `$.a[0]`" as an error whose ``field`` is ``$.a[0]``
    (for a missing or unknown key, the key itself: ``$.a``)."""
    message, _, path = str(exc).partition(" - at ")
    field = path.strip("`") or "$"
    named = _FIELD_MESSAGE.match(message)
    return InvalidInputError(message, field=f"{field}.{named.group(1)}" if named else field)


def stream_item(where: str, annotation: Any) -> Any:
    """The item type of a generator's return annotation: ``Iterator[T]``, ``Generator[T, ...]``,
    ``AsyncIterator[T]``, ``AsyncGenerator[T, ...]`` or ``Iterable[T]`` (Any when not annotated)."""
    if annotation is Any or _stand_in(annotation, deep=False):  # a stand-in for a missing package's iterator
        return Any
    origin = typing.get_origin(annotation)
    if origin in (collections.abc.Iterator, collections.abc.Generator, collections.abc.Iterable,
                  collections.abc.AsyncIterator, collections.abc.AsyncGenerator, collections.abc.AsyncIterable):
        args = typing.get_args(annotation)
        return args[0] if args else Any
    if annotation in (collections.abc.Iterator, collections.abc.Generator, collections.abc.AsyncIterator,
                      collections.abc.AsyncGenerator):
        return Any
    raise InvalidSpecError(f"{where}: a generator streams its items; annotate its return as Iterator[Item] "
                           f"(AsyncIterator[Item] for an async generator), not {annotation!r}")


def _list_item(tp: Any) -> Any | None:
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp) or (Any,)
        return item
    if tp is list:
        return Any
    return None


def _stand_in(hint: Any, deep: bool = True) -> bool:
    """Whether an annotation is (or, ``deep``, holds) a stand-in for a package this machine lacks (made only by
    ``ember._lenient``, never imported here: no stand-in exists unless ``ember push`` imported it)."""
    lenient = sys.modules.get("ember._lenient")
    if lenient is None:
        return False
    return isinstance(hint, lenient.Stub) or (deep and any(_stand_in(arg) for arg in typing.get_args(hint)))


def _known(hint: Any) -> Any:
    """An annotation msgspec can read: one that is or holds a stand-in becomes ``Any`` (a list of them a list of
    ``Any``, so that a batched function keeps its shape), which the node's import inside the image refines."""
    if not _stand_in(hint):
        return hint
    if typing.get_origin(hint) is list and typing.get_args(hint):
        return list[_known(typing.get_args(hint)[0])]  # type: ignore[misc]
    return Any


def _tensor_of(hint: Any) -> Tensor | None:
    """``tensor_of``, a stand-in ``numpy.ndarray`` (bare or ``Annotated``) read as the array it stands for."""
    found = tensor_of(hint)
    if found is not None or not _stand_in(hint):
        return found
    declared: list[Any] = []
    if typing.get_origin(hint) is typing.Annotated:
        hint, *declared = typing.get_args(hint)
    if repr(hint) != "<missing numpy.ndarray>":
        return None
    return next((e for e in declared if isinstance(e, Tensor)), Tensor())
