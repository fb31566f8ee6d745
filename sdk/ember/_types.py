"""Typed inputs and outputs, read from a function's annotations.

The same :class:`CallIO` encodes a call's arguments in the client, gives the JSON Schema the
platform validates requests against, and decodes the request in the replica.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from ember._errors import InvalidInputError, InvalidSpecError
from ember.wire import InputMode

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class CallIO:
    """How one function's calls are encoded and decoded."""

    def __init__(self, mode: InputMode, input_type: Any, output_type: Any, params: list[str],
                 signature: inspect.Signature) -> None:
        self.mode = mode
        self.input_type = input_type
        self.output_type = output_type
        self.params = params
        self.signature = signature
        # Pass a single input positionally unless it is keyword-only; several by keyword unless positional-only.
        kinds = {name: p.kind for name, p in signature.parameters.items()}
        self._positional = {name for name, kind in kinds.items()
                            if (kind in _POSITIONAL if mode == "single" else kind is inspect.Parameter.POSITIONAL_ONLY)}
        self._decoder = msgspec.json.Decoder(input_type) if mode != "none" else None

    @classmethod
    def of(cls, fn: Callable[..., Any], *, batched: bool, is_method: bool) -> CallIO:
        """Read the call types of ``fn`` (a plain function, or a method with ``self``)."""
        where = f"{fn.__qualname__}()"
        try:
            hints = typing.get_type_hints(fn)
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
            return cls._batched(where, params, hints, out, sig)
        if not params:
            return cls("none", None, out, [], sig)
        if len(params) == 1:
            p = params[0]
            return cls("single", hints.get(p.name, Any), out, [p.name], sig)
        fields = [(p.name, hints.get(p.name, Any)) if p.default is inspect.Parameter.empty
                  else (p.name, hints.get(p.name, Any), p.default) for p in params]
        args_type = msgspec.defstruct(f"{fn.__name__}_args", fields, kw_only=True, forbid_unknown_fields=True)
        return cls("kwargs", args_type, out, [p.name for p in params], sig)

    @classmethod
    def _batched(cls, where: str, params: list[inspect.Parameter], hints: dict[str, Any], out: Any,
                 sig: inspect.Signature) -> CallIO:
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
        return cls("single", item, out_item, [params[0].name], sig)

    def input_schema(self) -> dict[str, Any]:
        return {} if self.mode == "none" else msgspec.json.schema(self.input_type)

    def output_schema(self) -> dict[str, Any]:
        return msgspec.json.schema(self.output_type)

    def encode_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        """The HTTP body of a call made with Python arguments."""
        if self.mode == "none":
            if args or kwargs:
                raise TypeError("this function takes no arguments")
            return b"{}"
        if self.mode == "single":
            if len(args) + len(kwargs) != 1 or (kwargs and self.params[0] not in kwargs):
                raise TypeError(f"expected one argument, {self.params[0]!r}")
            return msgspec.json.encode(args[0] if args else kwargs[self.params[0]])
        return msgspec.json.encode(self.signature.bind(*args, **kwargs).arguments)

    def decode_input(self, body: bytes) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Python arguments from a request body (replica side)."""
        if self.mode == "none":
            return (), {}
        assert self._decoder is not None
        value = _decode(self._decoder, body)
        values = [value] if self.mode == "single" else [getattr(value, name) for name in self.params]
        args = tuple(v for name, v in zip(self.params, values, strict=True) if name in self._positional)
        kwargs = {name: v for name, v in zip(self.params, values, strict=True) if name not in self._positional}
        return args, kwargs

    def decode_item(self, body: bytes) -> Any:
        """One input of a batched function."""
        assert self._decoder is not None
        return _decode(self._decoder, body)

    def decode_output(self, raw: bytes) -> Any:
        return msgspec.json.decode(raw, type=self.output_type)


def _decode(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    try:
        return decoder.decode(body or b"null")
    except msgspec.ValidationError as exc:
        raise invalid_input(exc) from exc
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidInputError(f"malformed JSON: {exc}") from exc


_FIELD_MESSAGE = re.compile(r"Object (?:missing required|contains unknown) field `(.+)`")


def invalid_input(exc: msgspec.ValidationError) -> InvalidInputError:
    """msgspec's "Expected `int`, got `str` - at `$.a[0]`" as an error whose ``field`` is ``$.a[0]``
    (for a missing or unknown key, the key itself: ``$.a``)."""
    message, _, path = str(exc).partition(" - at ")
    field = path.strip("`") or "$"
    named = _FIELD_MESSAGE.match(message)
    return InvalidInputError(message, field=f"{field}.{named.group(1)}" if named else field)


def _list_item(tp: Any) -> Any | None:
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp) or (Any,)
        return item
    if tp is list:
        return Any
    return None
