"""The SDK's call verbs against a small in-process HTTP platform (starlette + uvicorn on a free port).

The fake speaks the platform's real HTTP API for the parts the SDK uses: sync calls, spawn, call
records with long polls, cancel, dead letters and replay. A call's input steers it: ``{"sleep": s}``
makes it take ``s`` seconds, ``{"fail": msg}`` makes it raise, ``{"hold": true}`` keeps it queued
until cancelled, ``{"value": v}`` is its result (else the input itself is).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import ember
from ember._client import record_op
from ember.cli import main as cli
from ember.wire import CallRecord, DeadLetter, ErrorBody, ErrorInfo, ReplayReply, SpawnReply, encoder


class Point(msgspec.Struct):
    x: float
    y: float


@dataclass
class _Call:
    call_id: str
    function: str
    body: Any
    created: float
    deadline: float = float("inf")
    cancelled: bool = False

    def record(self) -> CallRecord:
        now = time.time()
        status, output, error = "running", b"null", None
        body = self.body if isinstance(self.body, dict) else {}
        done_at = self.created + body.get("sleep", 0.0)
        if self.cancelled:
            status, error = "cancelled", ErrorInfo(code="cancelled", message="cancelled before it started")
        elif body.get("hold"):
            status = "queued"
        elif min(done_at, self.deadline) <= now:
            if self.deadline < done_at:
                status, error = "expired", ErrorInfo(code="deadline_exceeded", message="expired in the queue")
            elif "fail" in body:
                status, error = "failed", ErrorInfo(code="user_error", message=body["fail"], type="ValueError")
            else:
                status, output = "succeeded", encoder.encode(_result(self.function, self.body))
        return CallRecord(call_id=self.call_id, app="t", function=self.function, status=status,  # type: ignore[arg-type]
                          created_at=self.created, updated_at=now, attempts=1, output=msgspec.Raw(output),
                          error=error)

    def finishes_in(self) -> float:
        body = self.body if isinstance(self.body, dict) else {}
        return min(self.created + body.get("sleep", 0.0), self.deadline) - time.time()


def _result(function: str, body: Any) -> Any:
    if function == "add":
        return body["a"] + body.get("b", 0)
    return body.get("value", body) if isinstance(body, dict) else body


def _error(status: int, code: str, message: str, **extra: Any) -> Response:
    body = ErrorBody(error=ErrorInfo(code=code, message=message, **extra))
    return Response(encoder.encode(body), status_code=status, media_type="application/json")


def _json(value: Any, status: int = 200) -> Response:
    return Response(encoder.encode(value), status_code=status, media_type="application/json")


@dataclass
class FakePlatform:
    url: str = ""
    max_wait_s: float = 0.2  # the fake caps long polls, so that .get() must ask again
    in_flight: int = 0
    max_in_flight: int = 0
    calls: dict[str, _Call] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    headers: list[dict[str, str]] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    replays: list[Any] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)

    def reset(self) -> None:
        url = self.url
        self.__init__()  # type: ignore[misc]
        self.url = url

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/calls/{call_id}", self.get_call, methods=["GET"]),
            Route("/v1/calls/{call_id}", self.cancel_call, methods=["DELETE"]),
            Route("/v1/apps/{app}/dead", self.dead_letters, methods=["GET"]),
            Route("/v1/apps/{app}/dead/replay", self.replay, methods=["POST"]),
            Route("/v1/{app}/{name}/spawn", self.spawn, methods=["POST"]),
            Route("/v1/{app}/{name}", self.invoke, methods=["POST"]),
        ])

    async def invoke(self, request: Request) -> Response:
        self.headers.append(dict(request.headers))
        body = msgspec.json.decode(await request.body() or b"null")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if isinstance(body, dict):
                await asyncio.sleep(body.get("sleep", 0.0))
                if "fail" in body:
                    return _error(500, "user_error", body["fail"], type="ValueError")
            return _json(_result(request.path_params["name"], body))
        finally:
            self.in_flight -= 1

    async def spawn(self, request: Request) -> Response:
        self.headers.append(dict(request.headers))
        key = request.headers.get("idempotency-key")
        if key in self.keys:
            return _json(SpawnReply(call_id=self.keys[key], status="queued", created=False), 202)
        call = _Call(uuid.uuid4().hex, request.path_params["name"], msgspec.json.decode(await request.body()),
                     time.time())
        if "x-ember-timeout" in request.headers:
            call.deadline = call.created + float(request.headers["x-ember-timeout"])
        self.calls[call.call_id] = call
        if key is not None:
            self.keys[key] = call.call_id
        return _json(SpawnReply(call_id=call.call_id, status="queued"), 202)

    async def get_call(self, request: Request) -> Response:
        call = self.calls.get(request.path_params["call_id"])
        if call is None:
            return _error(404, "not_found", f"no call {request.path_params['call_id']}")
        wait = float(request.query_params.get("wait", 0))
        self.waits.append(wait)
        until = time.monotonic() + min(wait, self.max_wait_s)
        # A loop, not one sleep: an event loop's timer may fire a little before the call's finish time.
        while call.record().status not in ember.wire.FINAL_STATUSES and (left := until - time.monotonic()) > 0:
            await asyncio.sleep(min(left, max(call.finishes_in(), 0.001)))
        return _json(call.record())

    async def cancel_call(self, request: Request) -> Response:
        call = self.calls.get(request.path_params["call_id"])
        if call is None:
            return _error(404, "not_found", "no such call")
        if call.record().status != "queued":
            return _error(409, "conflict", f"call {call.call_id} is {call.record().status}")
        call.cancelled = True
        return _json(call.record())

    async def dead_letters(self, request: Request) -> Response:
        function = request.query_params.get("function")
        return _json([d for d in self.dead if d.function == function])

    async def replay(self, request: Request) -> Response:
        body = msgspec.json.decode(await request.body())
        self.replays.append(body)
        ids = body.get("call_ids") or [d.call_id for d in self.dead if d.function == body["function"]]
        return _json(ReplayReply(replayed=[f"new-{i}" for i in ids]))


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self.ready.set()


@pytest.fixture(scope="module")
def server() -> Iterator[FakePlatform]:
    fake = FakePlatform()
    config = uvicorn.Config(fake.app(), host="127.0.0.1", port=0, log_level="warning", access_log=False,
                            lifespan="off", ws="none", timeout_graceful_shutdown=1)
    srv = _Server(config)
    thread = threading.Thread(target=srv.run, name="fake-platform")
    thread.start()
    try:
        assert srv.ready.wait(20), "the fake platform did not start"
        fake.url = f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"
        yield fake
    finally:
        srv.should_exit = True  # calls still sleeping in the fake are cancelled after the grace period
        thread.join(20)
        assert not thread.is_alive()


@pytest.fixture
def fake(server: FakePlatform, monkeypatch: pytest.MonkeyPatch) -> FakePlatform:
    server.reset()
    monkeypatch.setenv("EMBER_URL", server.url)
    return server


@pytest.fixture
def fn() -> ember.FunctionHandle:
    return ember.lookup("t", "f")


def _typed() -> Any:
    app = ember.App("t")

    @app.function()
    def move(p: Point) -> Point:
        return p

    return move


# --- spawn and the call handle ------------------------------------------------------------------


def test_spawn_then_get_returns_the_typed_output(fake: FakePlatform) -> None:
    call = _typed().spawn(Point(1, 2))
    assert isinstance(call, ember.FunctionCall)
    assert call.get(timeout=10) == Point(1, 2)
    assert repr(call) == f"<FunctionCall {call.call_id}>"


def test_get_long_polls_until_the_call_is_final(fake: FakePlatform, fn: ember.FunctionHandle) -> None:
    call = fn.spawn({"sleep": 0.7, "value": 5})
    assert call.status() == "running"
    assert call.get() == 5
    polls = [w for w in fake.waits if w > 0]
    assert len(polls) >= 3  # the fake answers every 0.2 s at most, and .get() asked again
    assert max(polls) <= 30.0


def test_get_timeout_raises_and_the_call_goes_on(fake: FakePlatform, fn: ember.FunctionHandle) -> None:
    call = fn.spawn({"hold": True})
    started = time.monotonic()
    with pytest.raises(ember.DeadlineExceededError, match="still queued") as info:
        call.get(timeout=0.5)
    assert 0.5 <= time.monotonic() - started < 5
    assert isinstance(info.value, TimeoutError)
    assert info.value.call_id == call.call_id
    assert call.status() == "queued"
    with pytest.raises(ember.DeadlineExceededError):
        call.get(timeout=0)


def test_get_raises_the_calls_own_error(fake: FakePlatform, fn: ember.FunctionHandle) -> None:
    failed = fn.spawn({"fail": "bad pixels"})
    with pytest.raises(ember.RemoteError, match="bad pixels") as info:
        failed.get(timeout=10)
    assert (info.value.remote_type, info.value.call_id) == ("ValueError", failed.call_id)
    expired = fn.with_options(timeout_s=0.2).spawn({"sleep": 30})
    with pytest.raises(ember.DeadlineExceededError, match="expired in the queue"):
        expired.get(timeout=10)
    assert expired.status() == "expired"


def test_cancel_a_queued_call_but_not_a_running_one(fake: FakePlatform, fn: ember.FunctionHandle) -> None:
    queued = fn.spawn({"hold": True})
    assert queued.cancel() is True
    assert queued.status() == "cancelled"
    with pytest.raises(ember.EmberError, match="cancelled before it started"):
        queued.get(timeout=10)
    running = fn.spawn({"sleep": 30})
    assert running.cancel() is False
    assert running.status() == "running"


def test_from_id_rebuilds_a_handle(fake: FakePlatform) -> None:
    call = _typed().spawn(Point(3, 4))
    again = ember.FunctionCall.from_id(call.call_id)
    assert again.get(timeout=10) == {"x": 3, "y": 4}  # by id alone, the output type is not known
    record = again.record(wait_s=1)
    assert (record.call_id, record.status, record.attempts) == (call.call_id, "succeeded", 1)
    with pytest.raises(ember.NotFoundError):
        ember.FunctionCall.from_id("missing").status()
    assert record_op("a/../b").path == "/v1/calls/a%2F..%2Fb"  # an id is one path segment


def test_idempotency_key_and_timeout_are_options(fake: FakePlatform, fn: ember.FunctionHandle) -> None:
    keyed = fn.with_options(idempotency_key="order-7", timeout_s=60)
    first, second = keyed.spawn({"value": 1}), keyed.spawn({"value": 2})
    assert first.call_id == second.call_id
    assert [(h["idempotency-key"], h["x-ember-timeout"]) for h in fake.headers] == [("order-7", "60")] * 2
    assert fn.spawn({"value": 1}).call_id != first.call_id  # the original handle is unchanged
    with pytest.raises(TypeError, match=r"only \.spawn"):
        keyed.remote({"value": 1})
    with pytest.raises(TypeError, match=r"only \.spawn"):
        keyed.map([1])
    assert fn.with_options(timeout_s=2.5).remote({"value": 3}) == 3
    assert fake.headers[-1]["x-ember-timeout"] == "2.5"
    assert "idempotency-key" not in fake.headers[-1]


def test_options_merge_and_are_checked(fn: ember.FunctionHandle) -> None:
    merged = fn.with_options(timeout_s=5).with_options(idempotency_key="k")
    assert (merged._options.timeout_s, merged._options.idempotency_key) == (5, "k")
    assert type(_typed().with_options(timeout_s=1)).__name__ == "Function"
    for bad in ({"timeout_s": 0}, {"timeout_s": -1}, {"timeout_s": float("nan")}, {"idempotency_key": ""}):
        with pytest.raises(ValueError):
            fn.with_options(**bad)


def test_user_keyword_arguments_never_collide_with_options(fake: FakePlatform) -> None:
    app = ember.App("t")

    @app.function()
    def add(a: int, b: int = 0) -> int:
        return a + b

    assert add.spawn(a=1, b=2).get(timeout=10) == 3
    assert list(add.map([{"a": 1, "b": 1}, {"a": 2}])) == [2, 2]


# --- map ---------------------------------------------------------------------------------------


def test_map_keeps_a_bounded_number_in_flight(fake: FakePlatform, fn: ember.FunctionHandle) -> None:
    pulled = 0

    def inputs() -> Iterator[dict[str, Any]]:
        nonlocal pulled
        for i in range(16):
            pulled += 1
            yield {"sleep": 0.05, "value": i}

    results = fn.map(inputs(), max_concurrency=4)
    assert pulled == 0  # nothing is submitted before the first result is asked for
    first = next(results)
    assert first == 0 and pulled <= 4 + 1
    assert [first, *results] == list(range(16))
    assert 2 <= fake.max_in_flight <= 4


def test_map_reads_an_endless_iterable_lazily(fake: FakePlatform, fn: ember.FunctionHandle) -> None:
    results = fn.map(({"value": i} for i in itertools.count()), max_concurrency=3)
    assert list(itertools.islice(results, 5)) == [0, 1, 2, 3, 4]
    results.close()


def test_map_in_order_and_as_completed(fake: FakePlatform, fn: ember.FunctionHandle) -> None:
    inputs = [{"sleep": 0.1 * (4 - i), "value": i} for i in range(4)]
    assert list(fn.map(inputs, max_concurrency=4)) == [0, 1, 2, 3]
    assert list(fn.map(inputs, max_concurrency=4, order=False)) == [3, 2, 1, 0]


def test_map_raises_the_first_failure_in_its_turn(fake: FakePlatform, fn: ember.FunctionHandle) -> None:
    results = fn.map([{"value": 0}, {"fail": "no"}, {"value": 2}], max_concurrency=2)
    assert next(results) == 0
    with pytest.raises(ember.RemoteError, match="no"):
        next(results)


def test_map_checks_max_concurrency(fn: ember.FunctionHandle) -> None:
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="max_concurrency"):
            fn.map([1], max_concurrency=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_concurrency"):
            fn.map.aio([1], max_concurrency=bad)  # type: ignore[arg-type]


# --- async forms -------------------------------------------------------------------------------


def test_async_forms(fake: FakePlatform, fn: ember.FunctionHandle) -> None:
    async def main() -> None:
        assert await fn.remote.aio({"value": 1}) == 1
        assert await _typed().remote.aio(Point(1, 1)) == Point(1, 1)
        call = await fn.spawn.aio({"sleep": 0.3, "value": "done"})
        assert await call.status.aio() == "running"
        assert await call.get.aio(timeout=10) == "done"
        held = await fn.spawn.aio({"hold": True})
        with pytest.raises(ember.DeadlineExceededError):
            await held.get.aio(timeout=0.3)
        assert await held.cancel.aio() is True
        assert await call.cancel.aio() is False
        assert (await held.record.aio()).status == "cancelled"

    asyncio.run(main())


def test_async_map_is_bounded_ordered_or_as_completed(fake: FakePlatform, fn: ember.FunctionHandle) -> None:
    async def main() -> None:
        inputs = [{"sleep": 0.05 * (8 - i), "value": i} for i in range(8)]
        assert [r async for r in fn.map.aio(inputs, max_concurrency=3)] == list(range(8))
        assert fake.max_in_flight == 3
        unordered = [r async for r in fn.map.aio(inputs[4:], max_concurrency=4, order=False)]
        assert unordered == [7, 6, 5, 4]
        with pytest.raises(ember.RemoteError):
            async for _ in fn.map.aio([{"value": 0}, {"fail": "no"}]):
                pass

    asyncio.run(main())


def test_leaving_an_async_map_early_cancels_its_calls(fake: FakePlatform, fn: ember.FunctionHandle) -> None:
    async def main() -> None:
        inputs = [{"value": 0}, *({"sleep": 30, "value": i} for i in range(1, 5))]
        async with aclosing(fn.map.aio(inputs, max_concurrency=5)) as results:
            async for first in results:
                assert first == 0
                break
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < 10


def test_async_errors_are_embers_own(fake: FakePlatform) -> None:
    async def main() -> None:
        with pytest.raises(ember.NotFoundError):
            await ember.FunctionCall.from_id("missing").get.aio()

    asyncio.run(main())


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


# --- the CLI -----------------------------------------------------------------------------------


def test_cli_call_async_and_calls_get(fake: FakePlatform, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["call", "t.f", "--data", '{"sleep": 0.2, "value": [1, 2]}', "--async", "--timeout", "9"]) == 0
    call_id = capsys.readouterr().out.strip()
    assert call_id in fake.calls and fake.headers[-1]["x-ember-timeout"] == "9.0"
    assert cli(["calls", "get", call_id, "--wait", "5"]) == 0
    record = msgspec.json.decode(capsys.readouterr().out, type=CallRecord)
    assert (record.call_id, record.status, msgspec.json.decode(record.output)) == (call_id, "succeeded", [1, 2])


def test_cli_calls_cancel(fake: FakePlatform, fn: ember.FunctionHandle, capsys: pytest.CaptureFixture[str]) -> None:
    held, running = fn.spawn({"hold": True}), fn.spawn({"sleep": 30})
    assert cli(["calls", "cancel", held.call_id]) == 0
    assert capsys.readouterr().out.strip() == f"cancelled {held.call_id}"
    assert cli(["calls", "cancel", running.call_id]) == 1
    assert "is running; only a queued call can be cancelled" in capsys.readouterr().err
    assert cli(["calls", "get", "missing"]) == 1
    assert "NotFoundError" in capsys.readouterr().err


def test_cli_dead_letters_and_replay(fake: FakePlatform, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["calls", "dead", "t.f"]) == 0
    assert capsys.readouterr().out.strip() == "no dead letters for t.f"
    error = ErrorInfo(code="user_error", message="division by zero\nat line 3 " + "x" * 80, type="ZeroDivisionError")
    fake.dead = [DeadLetter(call_id=f"c{i}", app="t", function="f", error=error, attempts=3, dead_at=0.0,
                            input=msgspec.Raw(b"1")) for i in range(2)]
    assert cli(["calls", "dead", "t.f"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["CALL", "ID", "ATTEMPTS", "ERROR", "DEAD", "AT"]
    assert lines[2].startswith("c0") and "ZeroDivisionError: division by zero at line 3" in lines[2]
    assert len(lines) == 4 and lines[2].split()[1] == "3" and "..." in lines[2]
    assert cli(["calls", "replay", "t.f", "--id", "c1"]) == 0
    assert capsys.readouterr().out.split() == ["new-c1"]
    assert cli(["calls", "replay", "t.f"]) == 0
    assert capsys.readouterr().out.split() == ["new-c0", "new-c1"]
    assert fake.replays == [{"function": "f", "call_ids": ["c1"]}, {"function": "f"}]
    assert [c.call_id for c in ember.lookup("t", "f").replay(["c0"])] == ["new-c0"]
