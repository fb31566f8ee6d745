"""Which body and answer formats a call gets (Content-Type, Accept), what a msgpack or raw body becomes before it
is sent, and how an answer is turned into what the client asked for."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from starlette.requests import Request

from ember._errors import BadRequestError, InvalidInputError, RemoteError
from ember.wire import FunctionSpec
from ember_platform.gateway.binary import (
    BYTES_SCHEMA,
    Formats,
    UnsupportedMediaType,
    answer_body,
    negotiate,
    prepare,
    to_json,
)
from ember_platform.gateway.body import InputValidator

ECHO = FunctionSpec(name="echo", attr="echo", input_mode="single", params=["data"], input_schema=BYTES_SCHEMA,
                    output_schema=BYTES_SCHEMA)
PICTURE = {"$ref": "#/$defs/Picture", "$defs": {"Picture": {
    "title": "Picture", "type": "object", "properties": {"name": {"type": "string"}, "data": BYTES_SCHEMA},
    "required": ["name", "data"]}}}
DESCRIBE = FunctionSpec(name="describe", attr="describe", input_mode="single", params=["p"], input_schema=PICTURE,
                        output_schema={"type": "integer"})


def _request(**headers: str) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/v1/a/f",
                    "headers": [(k.replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]})


@pytest.mark.parametrize(("headers", "fn", "expected"), [
    ({}, ECHO, None),
    ({"content_type": "application/json"}, ECHO, None),
    ({"content_type": "application/json", "accept": "*/*"}, ECHO, None),
    ({"content_type": "application/octet-stream"}, ECHO, Formats("raw", "raw")),
    ({"content_type": "application/octet-stream", "accept": "*/*"}, ECHO, Formats("raw", "raw")),
    ({"content_type": "application/octet-stream", "accept": "application/json"}, ECHO, Formats("raw", "json")),
    ({"accept": "application/octet-stream"}, ECHO, Formats("json", "raw")),
    ({"accept": "application/octet-stream"}, DESCRIBE, None),  # not a bytes result: JSON
    ({"content_type": "application/msgpack"}, DESCRIBE, Formats("msgpack", "json")),
    ({"content_type": "Application/MsgPack; charset=x", "accept": "application/x-msgpack"}, DESCRIBE,
     Formats("msgpack", "msgpack")),
    ({"accept": "application/json, application/msgpack;q=0"}, DESCRIBE, None),
])
def test_negotiation(headers: dict[str, str], fn: FunctionSpec, expected: Formats | None) -> None:
    assert negotiate(_request(**headers), fn) == expected


def test_a_raw_body_for_a_function_not_of_bytes_is_a_415() -> None:
    with pytest.raises(UnsupportedMediaType) as refused:
        negotiate(_request(content_type="application/octet-stream"), DESCRIBE)
    assert (refused.value.http_status, refused.value.field) == (415, "Content-Type")


def test_bodies_become_msgpack_for_the_frame() -> None:
    echo, describe = InputValidator(ECHO), InputValidator(DESCRIBE)
    assert prepare(echo, Formats("raw", "raw"), b"\x00\x01") == (msgspec.msgpack.encode(b"\x00\x01"), True)
    picture = msgspec.msgpack.encode({"name": "a", "data": b"\xff"})
    assert prepare(describe, Formats("msgpack", "json"), picture) == (picture, True)
    packed, is_packed = prepare(describe, Formats("json", "msgpack"), b'{"name": "a", "data": "/w=="}')
    assert is_packed and msgspec.msgpack.decode(packed) == {"name": "a", "data": b"\xff"}
    assert to_json(describe, Formats("msgpack", "json"), picture) == b'{"name":"a","data":"/w=="}'
    assert to_json(echo, Formats("raw", "raw"), b"\xff") == b'"/w=="'


@pytest.mark.parametrize(("body", "error", "field"), [
    (b"\xc1", BadRequestError, None),
    (msgspec.msgpack.encode({"name": 1, "data": b""}), InvalidInputError, "$.name"),
    (msgspec.msgpack.encode({"name": "a", "data": "/w=="}), InvalidInputError, "$.data"),  # bin, not base64
    (msgspec.msgpack.encode({"name": "a"}), InvalidInputError, "$.data"),
    (msgspec.msgpack.encode({"name": "a", "data": b""}) + b"\x00", BadRequestError, None),
])
def test_a_bad_msgpack_body_is_refused(body: bytes, error: type[Exception], field: str | None) -> None:
    with pytest.raises(error) as refused:
        InputValidator(DESCRIBE).check_packed(body)
    assert getattr(refused.value, "field", None) == field


def test_a_schema_without_a_typed_decoder_checks_msgpack_as_json_sees_it() -> None:
    pattern = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]+$"}},
               "required": ["code"]}
    spec = FunctionSpec(name="f", attr="f", input_mode="single", params=["p"], input_schema=pattern)
    validator = InputValidator(spec)
    assert validator.check_packed(msgspec.msgpack.encode({"code": "abc"}))
    with pytest.raises(InvalidInputError):
        validator.check_packed(msgspec.msgpack.encode({"code": "ABC"}))
    assert validator.to_packed(b'{"code": "abc"}') is None  # untyped: it travels as JSON


ANY = FunctionSpec(name="g", attr="g", input_mode="kwargs", params=["x"],
                   input_schema={"type": "object", "properties": {"x": {}}, "required": ["x"]})
PATTERN = FunctionSpec(name="f", attr="f", input_mode="kwargs", params=["s"], input_schema={
    "type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}, "required": ["s"]})


@pytest.mark.parametrize("body", [msgspec.msgpack.encode({"s": "a", "x": msgspec.msgpack.Ext(5, b"zz")}),
                                  b"\x82\xa1s\xa1a\xa1x\x81\x92\x01\x02\xa1a"])  # {"x": {[1, 2]: "a"}}
@pytest.mark.parametrize(("spec", "door"), [(PATTERN, prepare), (PATTERN, to_json), (ANY, to_json)])
def test_msgpack_that_json_cannot_say_is_a_400_where_it_is_read_as_json(body: bytes, spec: FunctionSpec,
                                                                          door: Any) -> None:
    """An extension type or a map key that is not a string, where the schema check or the queue reads the body as
    JSON (500s before, from the JSON encoder)."""
    with pytest.raises(BadRequestError) as refused:
        door(InputValidator(spec), Formats("msgpack", "json"), body)
    assert refused.value.field == "$"


def test_an_integer_wider_than_msgpack_holds_travels_as_json() -> None:
    """A JSON body with a 100-bit integer, from a client that accepts msgpack answers (a 500 before)."""
    body = b'{"x": 123456789012345678901234567890}'
    assert prepare(InputValidator(ANY), Formats("json", "msgpack"), body) == (body, False)


@pytest.mark.parametrize(("output", "packed", "wanted", "expected"), [
    (b'"/w=="', False, "raw", b"\xff"),
    (msgspec.msgpack.encode(b"\xff"), True, "raw", b"\xff"),
    (msgspec.msgpack.encode({"a": b"\xff"}), True, "json", b'{"a":"/w=="}'),
    (b'{"a":[1,2]}', False, "msgpack", msgspec.msgpack.encode({"a": [1, 2]})),
    (msgspec.msgpack.encode([1]), True, "msgpack", msgspec.msgpack.encode([1])),
])
def test_answers_take_the_wanted_format(output: bytes, packed: bool, wanted: Any, expected: bytes) -> None:
    assert answer_body(msgspec.Raw(output), packed, wanted) == expected


def test_a_bytes_function_that_returned_something_else_is_the_users_error() -> None:
    with pytest.raises(RemoteError, match="bytes"):
        answer_body(msgspec.Raw(b"12"), False, "raw")
