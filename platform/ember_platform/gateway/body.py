"""Reading and validating request bodies before any work starts."""

from __future__ import annotations

import itertools
from typing import Any, TypeVar

import msgspec
import re2
from jsonschema.exceptions import ValidationError, best_match
from starlette.requests import ClientDisconnect, Request

from ember._errors import BadRequestError, InvalidInputError, PayloadTooLargeError
from ember._types import invalid_input
from ember.wire import Deployment, FunctionSpec
from ember_platform.gateway.patterns import SafeValidator
from ember_platform.gateway.schema import decoders_for

T = TypeVar("T")


MAX_DEPTH = 64  # arrays and objects inside one another: far more than any request needs, far less than what a
#                decoder's stack holds on the gateway or a replica (a call's body travels inside a frame, an OpenAI
#                request's unknown fields inside its ``extra``: a few levels more)


def decode_json(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    """A request body of an API route (not a call's input) as its Struct: 400 for malformed JSON or JSON nested deeper
    than ``MAX_DEPTH``, 422 naming the field that does not fit."""
    check_depth(body)
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        if "got `float`" not in str(exc):
            raise invalid_input(exc) from exc
        error = exc
    except (msgspec.DecodeError, RecursionError) as exc:
        raise BadRequestError(f"malformed JSON body: {exc}") from exc
    try:  # JSON Schema's integers include 2.0: taken as 2 by an int field (a float field takes ints anyway)
        value = msgspec.json.decode(body)  # the typed decoder stopped at 2.0: the rest may still be malformed
    except msgspec.DecodeError as exc:
        raise BadRequestError(f"malformed JSON body: {exc}") from exc
    try:
        return msgspec.convert(_integral(value), decoder.type, strict=True)
    except msgspec.ValidationError:
        raise invalid_input(error) from error


def _integral(value: Any) -> Any:
    """``value`` (decoded JSON, at most ``MAX_DEPTH`` deep) with every float that is a whole number as an int."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def check_depth(body: bytes) -> None:
    """400 for a JSON body whose arrays and objects nest deeper than ``MAX_DEPTH`` (or, when it is not JSON, for
    that), before any decoder recurses into it: what the gateway takes, a replica can decode."""
    if body.count(b"[") + body.count(b"{") <= MAX_DEPTH or _WITHIN_DEPTH.fullmatch(body) is not None:
        return
    try:  # not nested within the limit, or not JSON at all: which one
        msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise BadRequestError(f"malformed JSON body: {exc}") from exc
    except RecursionError:
        pass
    raise _too_deep()


def check_packed_depth(body: bytes) -> None:
    """``check_depth`` for a msgpack body (malformed msgpack is left to its decoder)."""
    if len(body) <= MAX_DEPTH:
        return  # too few bytes to open that many arrays and maps (counting the bytes that could was a copy of it)
    try:
        value = msgspec.msgpack.decode(body)
    except RecursionError:
        raise _too_deep() from None
    except msgspec.DecodeError:
        return
    if nested_deeper(value, MAX_DEPTH):
        raise _too_deep()


def _too_deep() -> BadRequestError:
    return BadRequestError(f"the body nests arrays and objects deeper than {MAX_DEPTH} levels, the most Ember takes")


def _within(depth: int) -> bytes:
    """A regular expression of the JSON texts (well, their brackets and strings) nested at most ``depth`` deep: at a
    fixed depth, balanced brackets are a regular language, which RE2 matches in linear time (about a millisecond a
    megabyte), whatever the body holds."""
    flat = rb'(?:[^\[\]{}"]|"(?:[^"\\]|\\.)*")*'  # anything but a bracket, strings whole
    pattern = flat
    for _ in range(depth):
        pattern = flat + rb"(?:[\[{]" + pattern + rb"[\]}]" + flat + rb")*"
    return pattern


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1  # bytes as bytes: a body need not be UTF-8 to be measured
    options.dot_nl = True
    options.never_capture = True
    return options


_WITHIN_DEPTH = re2.compile(_within(MAX_DEPTH), _re2_options())
_NESTED = frozenset({list, tuple, dict})  # what msgspec decodes msgpack's arrays and maps as (tuples: map keys)


def nested_deeper(value: Any, limit: int) -> bool:
    """Whether decoded ``value``'s lists, tuples and dicts nest deeper than ``limit``, level by level (no recursion;
    its items are sorted out by C loops)."""
    level = [value]
    for _ in range(limit + 1):
        if _NESTED.isdisjoint(map(type, level)):  # a level of numbers and strings alone (a tensor's): one C pass
            return False
        nested = list(itertools.compress(level, map(_NESTED.__contains__, map(type, level))))
        if not nested:
            return False
        level = list(itertools.chain.from_iterable(
            itertools.chain.from_iterable(v.items()) if type(v) is dict else v for v in nested))
    return True


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` (before reading it all)."""
    declared = header(request, b"content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequestError("Content-Length is not a number")
        if int(declared) > limit:
            raise PayloadTooLargeError(f"body of {declared} bytes is over the {limit}-byte limit")
    chunks, size = [], 0
    while True:  # the ASGI messages themselves: starlette's stream() costs an async generator per request
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"body is over the {limit}-byte limit")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def header(request: Request, name: bytes) -> str | None:
    """A request header's value (``name`` in lowercase), read straight from the ASGI scope: cheaper than
    starlette's ``request.headers`` for the one or two headers the hot path reads."""
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None


class Validators:
    """Each function's ``InputValidator``, built on its first call and kept per version: during a rollout or a
    canary, calls alternate between versions, and each keeps its own (the newest ``KEPT_VERSIONS`` of a function)."""

    KEPT_VERSIONS = 4

    def __init__(self) -> None:
        self._by_function: dict[tuple[str, str], dict[int, InputValidator]] = {}  # (app, fn) -> version -> validator

    def of(self, dep: Deployment, spec: FunctionSpec) -> InputValidator:
        kept = self._by_function.setdefault((dep.app, spec.name), {})
        validator = kept.get(dep.version)
        if validator is None:
            if len(kept) >= self.KEPT_VERSIONS:
                del kept[min(kept)]
            validator = kept[dep.version] = InputValidator(spec)
        return validator


class InputValidator:
    """Checks a call's JSON body against a function's input schema, naming the field at fault."""

    def __init__(self, spec: FunctionSpec) -> None:
        self.mode = spec.input_mode
        needs_check = bool(spec.input_schema) and self.mode != "none"
        decoders = decoders_for(spec.input_schema) if needs_check else None
        self._fast: msgspec.json.Decoder[Any] | None = decoders[0] if decoders is not None else None
        self._fast_packed: msgspec.msgpack.Decoder[Any] | None = decoders[1] if decoders is not None else None
        self._schema = SafeValidator(spec.input_schema) if needs_check and self._fast is None else None

    def check_packed(self, body: bytes) -> bytes:
        """Return a msgpack body to forward (an empty map for a function without inputs) or raise a 400/422 error."""
        if self.mode == "none" and not body:
            return _EMPTY_MAP
        check_packed_depth(body)
        try:
            if self._fast_packed is not None:
                self._fast_packed.decode(body)
                return body
            value = msgspec.msgpack.decode(body)
        except msgspec.ValidationError as exc:
            raise invalid_input(exc) from exc
        except (msgspec.DecodeError, RecursionError) as exc:
            raise BadRequestError(f"malformed msgpack body: {exc}") from exc
        if self.mode == "none":
            if value not in ({}, None):
                raise InvalidInputError("this function takes no inputs; send an empty body or {}", field="$")
            return _EMPTY_MAP
        if self._schema is not None:
            first = next(self._schema.iter_errors(_as_json(value)), None)
            if first is not None:
                error = best_match([first])
                raise InvalidInputError(_message(error), field=_field(error))
        return body

    def to_packed(self, checked: bytes) -> bytes | None:
        """A checked JSON body as msgpack, when its schema has a typed decoder (bytes then become ``bin``); None when
        it has not (the call then travels as JSON)."""
        if self.mode == "none":
            return _EMPTY_MAP
        try:
            if self._fast is not None:
                return msgspec.msgpack.encode(self._fast.decode(checked))
            if self._schema is None:  # no schema: nothing typed to lose
                return msgspec.msgpack.encode(msgspec.json.decode(checked))
        except OverflowError:  # an integer msgpack cannot hold (wider than 64 bits): the call travels as JSON
            return None
        return None

    def check(self, body: bytes) -> bytes:
        """Return the body to forward (``{}`` for a function without inputs) or raise a 400/422 error."""
        if self.mode == "none" and not body.strip():
            return b"{}"
        check_depth(body)
        try:
            if self._fast is not None:
                try:
                    self._fast.decode(body)
                    return body
                except msgspec.ValidationError as exc:
                    msgspec.json.decode(body)  # a typed decoder may stop before it sees malformed JSON
                    raise invalid_input(exc) from exc
            value = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise BadRequestError(f"malformed JSON body: {exc}") from exc
        if self.mode == "none":
            if value not in ({}, None):
                raise InvalidInputError("this function takes no inputs; send an empty body or {}", field="$")
            return b"{}"
        if self._schema is not None:
            # The first error in document order (best_match descends into anyOf/oneOf alternatives).
            first = next(self._schema.iter_errors(value), None)
            if first is not None:
                error = best_match([first])
                raise InvalidInputError(_message(error), field=_field(error))
        return body


_EMPTY_MAP = msgspec.msgpack.encode({})


def _as_json(value: Any) -> Any:
    """A decoded msgpack value as JSON sees it (``bin`` as base64 strings), for the generic schema check."""
    return msgspec.json.decode(json_of_msgpack(value))


def json_of_msgpack(value: Any) -> bytes:
    """A decoded msgpack value as JSON; a 400 for what JSON cannot say (an extension type, a map key that is not a
    string), which a function's input never holds."""
    try:
        return msgspec.json.encode(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadRequestError(f"the msgpack body holds what JSON cannot ({exc}): extension types and map keys that "
                              "are not strings are not inputs", field="$") from None


def _field(error: ValidationError) -> str:
    path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [k for k in error.validator_value if k not in error.instance]
        if missing:
            return f"{path}.{missing[0]}"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        if extra:
            return f"{path}.{extra[0]}"
    return path


def _message(error: ValidationError) -> str:
    message = error.message
    return message if len(message) <= 300 else message[:300] + "..."
