"""The SDK's call verbs where no platform is needed (options, argument checks, an unreachable platform, the
documentation of the verbs), and the client's own retry of a long poll. The verbs against the real platform are in
tests/integration/test_sdk_calls.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

import ember
from ember._client import record_op
from ember.wire import CallRecord, encoder


@pytest.fixture
def fn() -> ember.FunctionHandle:
    return ember.lookup("t", "f")


def _typed() -> Any:
    app = ember.App("t")

    @app.function()
    def move(x: int) -> int:
        return x

    return move


class _Unfinished(BaseHTTPRequestHandler):
    """Answers each long poll of a call at once, "running", until the fourth: the client must ask again."""

    waits: list[float] = []

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        self.waits.append(float(parse_qs(url.query).get("wait", ["0"])[0]))
        done = len(self.waits) >= 4
        record = CallRecord(call_id=url.path.rsplit("/", 1)[1], app="t", function="f",
                            status="succeeded" if done else "running", created_at=0.0, updated_at=0.0, attempts=1,
                            output=msgspec.Raw(b"5" if done else b"null"))
        body = encoder.encode(record)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def unfinished(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """A real HTTP server that answers every long poll before the call is final (as a platform may, at its cap);
    the waits the client asked for."""
    _Unfinished.waits = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Unfinished)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("EMBER_URL", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield _Unfinished.waits
    finally:
        server.shutdown()
        server.server_close()


def test_get_asks_again_until_the_call_is_final(unfinished: list[float]) -> None:
    """The client's own retry: a long poll answered before the call is final is asked again, with a wait."""
    assert ember.FunctionCall.from_id("c1").get(timeout=30) == 5
    assert len(unfinished) == 4 and all(0 < w <= 30.0 for w in unfinished)
    del unfinished[:]
    assert asyncio.run(ember.FunctionCall.from_id("c2").get.aio(timeout=30)) == 5
    assert len(unfinished) == 4


def test_a_call_id_is_one_path_segment() -> None:
    assert record_op("a/../b").path == "/v1/calls/a%2F..%2Fb"


def test_options_merge_and_are_checked(fn: ember.FunctionHandle) -> None:
    merged = fn.with_options(timeout_s=5).with_options(idempotency_key="k")
    assert (merged._options.timeout_s, merged._options.idempotency_key) == (5, "k")
    assert type(_typed().with_options(timeout_s=1)).__name__ == "Function"
    for bad in ({"timeout_s": 0}, {"timeout_s": -1}, {"timeout_s": float("nan")}, {"idempotency_key": ""}):
        with pytest.raises(ValueError):
            fn.with_options(**bad)


def test_map_checks_max_concurrency(fn: ember.FunctionHandle) -> None:
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="max_concurrency"):
            fn.map([1], max_concurrency=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_concurrency"):
            fn.map.aio([1], max_concurrency=bad)  # type: ignore[arg-type]


def test_an_unreachable_platform_is_a_connection_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_URL", "http://127.0.0.1:9")
    with pytest.raises(ember.ConnectionError, match="cannot reach"):
        ember.lookup("t", "f").spawn(1)
    with pytest.raises(ember.ConnectionError, match="cannot reach"):
        asyncio.run(ember.lookup("t", "f").spawn.aio(1))


def test_verbs_are_documented_on_the_class_and_the_handle(fn: ember.FunctionHandle) -> None:
    for name in ("remote", "spawn", "map"):
        assert getattr(ember.FunctionHandle, name).__doc__
        assert getattr(fn, name).__doc__ == getattr(ember.FunctionHandle, name).__doc__
    for name in ("get", "status", "cancel", "record"):
        assert getattr(ember.FunctionCall, name).__doc__
    assert repr(fn.spawn) == "<verb spawn of <FunctionHandle t.f>>"
