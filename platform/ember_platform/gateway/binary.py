"""Bodies other than JSON on a function's own routes: raw bytes (``application/octet-stream``) and msgpack
(``application/msgpack``), in and out, and each function's body limit.

A call with a JSON body that wants a JSON answer never comes here (``negotiate`` says None: the hot path is
unchanged). Every other call travels to its replica in a msgpack frame, so that bytes cross NATS raw, not as
base64: a raw body becomes a msgpack ``bin``, a msgpack body goes as it came (once validated), and a JSON body
whose answer is wanted in msgpack or raw is re-encoded when its schema has a typed decoder. The answer comes back
in the frame's codec and is turned into what the client asked for.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import msgspec
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from ember._errors import BadRequestError, PayloadTooLargeError, RemoteError
from ember.wire import FRAME_ITEM_OVERHEAD_BYTES, FunctionSpec
from ember_platform.gateway.body import InputValidator, json_of_msgpack, read_body
from ember_platform.platform import Platform

Format = Literal["json", "msgpack", "raw"]
MSGPACK = "application/msgpack"
OCTET_STREAM = "application/octet-stream"
_MSGPACK_TYPES = frozenset({MSGPACK, "application/x-msgpack", "application/vnd.msgpack"})
BYTES_SCHEMA = {"type": "string", "contentEncoding": "base64"}  # what msgspec says of ``bytes``
_JSON_ACCEPTS = frozenset({"*/*", "application/json"})
_MEDIA = {"json": b"application/json", "msgpack": MSGPACK.encode(), "raw": OCTET_STREAM.encode()}


class UnsupportedMediaType(BadRequestError):
    """A body of a type the function cannot take (a raw body for a function whose input is not ``bytes``)."""

    http_status = 415


class Formats(NamedTuple):
    body: Format
    answer: Format


def takes_bytes(fn: FunctionSpec) -> bool:
    """Its one parameter is ``bytes``: a raw body is that parameter."""
    return fn.input_mode == "single" and fn.input_schema == BYTES_SCHEMA


def returns_bytes(fn: FunctionSpec) -> bool:
    return fn.output_schema == BYTES_SCHEMA


def negotiate(request: Request, fn: FunctionSpec) -> Formats | None:
    """The body's format (``Content-Type``) and the answer's (``Accept``); None for JSON both ways.

    The answer is msgpack when ``Accept`` names msgpack; raw bytes when the function returns ``bytes`` and
    ``Accept`` names ``application/octet-stream``, or the body was raw and ``Accept`` is absent or ``*/*``;
    JSON otherwise. Errors are JSON whatever is asked."""
    ctype = accept = None
    for key, value in request.scope["headers"]:  # one pass for both: this runs on every call
        if key == b"content-type":
            ctype = value.decode("latin-1")
        elif key == b"accept":
            accept = value.decode("latin-1")
    if (accept is None or accept in _JSON_ACCEPTS) and (ctype is None or ctype.startswith("application/json")):
        return None  # the common JSON call, answered at once
    kind = (ctype or "").partition(";")[0].strip().lower()
    body: Format = "msgpack" if kind in _MSGPACK_TYPES else "raw" if kind == OCTET_STREAM else "json"
    wanted = _accepted(accept)
    answer: Format = "json"
    if wanted & _MSGPACK_TYPES:
        answer = "msgpack"
    elif returns_bytes(fn) and (OCTET_STREAM in wanted or (body == "raw" and (not wanted or "*/*" in wanted))):
        answer = "raw"
    if body == "raw" and not takes_bytes(fn):
        raise UnsupportedMediaType(f"{fn.name} takes JSON or msgpack bodies; a raw {OCTET_STREAM} body goes to a "
                                   "function whose one parameter is bytes", field="Content-Type")
    return None if body == answer == "json" else Formats(body, answer)


def _accepted(accept: str | None) -> set[str]:
    """The media types ``Accept`` names (those with ``q=0`` left out)."""
    if not accept:
        return set()
    types = set()
    for item in accept.split(",")[:32]:
        media, _, params = item.partition(";")
        if params.replace(" ", "").lower() in ("q=0", "q=0.0", "q=0.00", "q=0.000"):
            continue
        types.add(media.strip().lower())
    return types


def body_limit(platform: Platform, fn: FunctionSpec) -> int:
    """The largest body a call of ``fn`` takes: its ``max_body_bytes`` (else the platform's default), within the
    platform's cap and what one NATS message carries."""
    limit = fn.max_body_bytes or platform.settings.max_body_bytes
    return min(limit, platform.settings.max_body_cap_bytes, platform.nc.max_payload - FRAME_ITEM_OVERHEAD_BYTES)


async def read_call_body(request: Request, platform: Platform, app: str, fn: FunctionSpec) -> bytes:
    """A call's body within its function's limit; the 413 names the limit and where it comes from."""
    try:
        return await read_body(request, body_limit(platform, fn))
    except PayloadTooLargeError as exc:
        raise over_limit(platform, app, fn, str(exc)) from exc


def over_limit(platform: Platform, app: str, fn: FunctionSpec, what: str) -> PayloadTooLargeError:
    """The 413 of a call over its function's limit: ``what`` is over it, with the limit and where it comes from."""
    limit = body_limit(platform, fn)
    source = (f"{app}.{fn.name}'s max_body_bytes" if fn.max_body_bytes else "the platform's EMBER_MAX_BODY_BYTES")
    if limit < (fn.max_body_bytes or platform.settings.max_body_bytes):
        source = "the platform's cap (EMBER_MAX_BODY_CAP_BYTES, or the NATS message limit)"
    return PayloadTooLargeError(f"{what} ({source}: {limit} bytes)", field="body")


def prepare(validator: InputValidator, formats: Formats, body: bytes) -> tuple[bytes, bool]:
    """The validated input to send, and whether it is msgpack (then the call travels in a msgpack frame)."""
    if formats.body == "raw":
        return msgspec.msgpack.encode(body), True
    if formats.body == "msgpack":
        return validator.check_packed(body), True
    checked = validator.check(body)
    packed = validator.to_packed(checked)
    return (packed, True) if packed is not None else (checked, False)


def to_json(validator: InputValidator, formats: Formats | None, body: bytes) -> bytes:
    """A validated body as JSON, for a queued call (the queue keeps JSON inputs): a raw body is its base64
    string, a msgpack one is re-encoded (its ``bin`` values as base64 strings, as a JSON caller sends bytes)."""
    if formats is None or formats.body == "json":
        return validator.check(body)
    payload, _ = prepare(validator, formats, body)
    return json_of_msgpack(msgspec.msgpack.decode(payload))


def answer_body(output: msgspec.Raw, packed: bool, wanted: Format) -> bytes:
    """The call's output (msgpack if ``packed``, else JSON) in the format the client wants."""
    if wanted == "raw":
        try:
            return msgspec.msgpack.decode(output, type=bytes) if packed else msgspec.json.decode(output, type=bytes)
        except msgspec.MsgspecError as exc:
            raise RemoteError("the function is annotated to return bytes but returned something else",
                              remote_type="TypeError") from exc
    if packed == (wanted == "msgpack"):
        return bytes(output)
    if packed:
        return msgspec.json.encode(msgspec.msgpack.decode(output))
    return msgspec.msgpack.encode(msgspec.json.decode(output))


class BodyAnswer:
    """A 200 answer with a body of a given media type, its headers built by hand (as ``JsonAnswer``)."""

    __slots__ = ("body", "headers")

    def __init__(self, body: bytes, wanted: Format, headers: list[tuple[bytes, bytes]]) -> None:
        self.body = body
        self.headers = [(b"content-length", b"%d" % len(body)), (b"content-type", _MEDIA[wanted]), *headers]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})
