"""The SDK's bytes: a bytes argument goes as a raw body (not base64) over HTTP, a raw answer comes back as bytes,
and a call made from inside a replica (over NATS, as JSON) still carries it."""

from __future__ import annotations

import httpx
import msgspec

import ember
from ember import _client
from ember._client import RawBody, RawOutput, _content, invoke_op, spawn_op
from ember._function_call import decode_output


def test_a_bytes_argument_is_a_raw_body() -> None:
    app = ember.App("raw")

    @app.function()
    def echo(data: bytes) -> bytes:
        return data

    @app.function()
    def count(items: list[int]) -> int:
        return len(items)

    assert isinstance(echo._encode((b"\x00\xff",), {}), RawBody)
    assert isinstance(ember.lookup("raw", "echo")._encode((bytearray(b"x"),), {}), RawBody)
    assert count._encode(([1, 2],), {}) == b"[1,2]"
    op = invoke_op("raw", "echo", RawBody(b"\x00"))
    assert op.headers["content-type"] == "application/octet-stream"
    assert "application/octet-stream" in op.headers["accept"]
    assert spawn_op("raw", "echo", RawBody(b"\x00")).headers["content-type"] == "application/octet-stream"
    assert invoke_op("raw", "count", b"[1]").headers["content-type"] == "application/json"


def test_a_raw_answer_is_the_bytes_themselves() -> None:
    raw = _content(httpx.Response(200, content=b"\x00\xff", headers={"content-type": "application/octet-stream"}))
    assert isinstance(raw, RawOutput)
    assert invoke_op("raw", "echo", b"").decode(raw) is raw  # the marker survives the op's decoding
    assert decode_output(None, raw) == b"\x00\xff"
    assert decode_output(None, _content(httpx.Response(200, content=b'"ok"'))) == "ok"


def test_inside_a_replica_bytes_go_as_json(monkeypatch) -> None:
    monkeypatch.setattr(_client, "inner", object())  # what a replica installs: calls go over its relay, as JSON
    body = ember.lookup("raw", "echo")._encode((b"\x00\xff",), {})
    assert not isinstance(body, RawBody)
    assert msgspec.json.decode(body, type=bytes) == b"\x00\xff"
