"""The SDK's and the CLI's call verbs against the real platform (the session platform, the ``steer`` app): spawn
and the call handle, options, map, the ``.aio`` forms, and the CLI's calls. A call's input steers the function
(tests/apps/steer/steer.py): ``{"sleep": s}``, ``{"fail": msg}``, ``{"value": v}``. The SDK's own retries of a
long poll are in tests/unit/sdk/test_sdk_call_options.py."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from collections.abc import Iterator
from contextlib import aclosing
from typing import Any

import msgspec
import pytest
from support.paths import TEST_APPS
from support.polling import wait_for

import ember
from ember.wire import AppView

pytestmark = pytest.mark.integration


class Point(msgspec.Struct):
    x: float
    y: float


@pytest.fixture(scope="module")
def steer(deployed: Any) -> AppView:
    return deployed(TEST_APPS / "steer" / "steer.py")


@pytest.fixture
def fn(steer: AppView, ember_url: str) -> ember.FunctionHandle:
    return ember.lookup("steer", "f")


def _typed() -> Any:
    """The app's ``move`` as its author's module defines it: calls through it are typed."""
    app = ember.App("steer")

    @app.function()
    def move(p: Point) -> Point:
        return p

    return move


def _busy(one: ember.FunctionHandle, seconds: float = 3.0) -> ember.FunctionCall:
    """A call that holds ``one`` (one call at a time) for ``seconds``: the next call waits in the queue."""
    busy = one.spawn(seconds)
    wait_for(lambda: busy.status() == "running", 60, "the busy call to start")
    return busy


# --- spawn and the call handle ------------------------------------------------------------------


def test_spawn_then_get_returns_the_typed_output(steer: AppView, ember_url: str) -> None:
    call = _typed().spawn(Point(1, 2))
    assert isinstance(call, ember.FunctionCall)
    assert call.get(timeout=60) == Point(1, 2)
    assert repr(call) == f"<FunctionCall {call.call_id}>"


def test_get_waits_until_the_call_is_final(steer: AppView, ember_url: str) -> None:
    # 3 s: long enough that the status below is asked before it ends (a loaded run took over 1 s to ask); on
    # "one", whose calls take seconds in these tests, not "f", whose measured run time decides whether a later
    # call with a 0.5 s deadline is admitted (test_idempotency_key_and_timeout_are_options)
    call = ember.lookup("steer", "one").spawn(3.0)
    assert call.status() in {"queued", "running"}
    assert call.get(timeout=60) == 3.0
    assert call.status() == "succeeded"


def test_get_timeout_raises_and_the_call_goes_on(fn: ember.FunctionHandle) -> None:
    one = ember.lookup("steer", "one")
    busy = _busy(one)
    queued = one.spawn(0.1)
    with pytest.raises(ember.DeadlineExceededError, match="still queued") as info:
        queued.get(timeout=0.5)
    assert isinstance(info.value, TimeoutError)
    assert info.value.call_id == queued.call_id
    assert queued.status() == "queued"
    with pytest.raises(ember.DeadlineExceededError):
        queued.get(timeout=0)
    assert busy.get(timeout=60) == 3.0 and queued.get(timeout=60) == 0.1


def test_get_raises_the_calls_own_error(fn: ember.FunctionHandle) -> None:
    failed = fn.spawn({"fail": "bad pixels"})
    with pytest.raises(ember.RemoteError, match="bad pixels") as info:
        failed.get(timeout=60)
    assert (info.value.remote_type, info.value.call_id) == ("ValueError", failed.call_id)
    one = ember.lookup("steer", "one")
    busy = _busy(one)
    expired = one.with_options(timeout_s=0.2).spawn(0.1)
    with pytest.raises(ember.DeadlineExceededError):
        expired.get(timeout=60)
    assert expired.status() == "expired"
    busy.get(timeout=60)


def test_cancel_a_queued_call_but_not_a_finished_one(fn: ember.FunctionHandle) -> None:
    one = ember.lookup("steer", "one")
    running = _busy(one)
    queued = one.spawn(0.1)
    assert queued.cancel() is True
    assert queued.status() == "cancelled"
    with pytest.raises(ember.EmberError, match="cancelled"):
        queued.get(timeout=10)
    assert running.get(timeout=60) == 3.0
    assert running.cancel() is False  # finished (a running call is cancelled: test_cancel_running)


def test_from_id_rebuilds_a_handle(steer: AppView, ember_url: str) -> None:
    call = _typed().spawn(Point(3, 4))
    again = ember.FunctionCall.from_id(call.call_id)
    assert again.get(timeout=60) == {"x": 3, "y": 4}  # by id alone, the output type is not known
    record = again.record(wait_s=1)
    assert (record.call_id, record.status, record.attempts) == (call.call_id, "succeeded", 1)
    with pytest.raises(ember.NotFoundError):
        ember.FunctionCall.from_id(uuid.uuid4().hex).status()


def test_idempotency_key_and_timeout_are_options(fn: ember.FunctionHandle) -> None:
    keyed = fn.with_options(idempotency_key=f"order-{uuid.uuid4().hex}", timeout_s=60)
    first, second = keyed.spawn({"value": 1}), keyed.spawn({"value": 1})
    assert first.call_id == second.call_id and second.get(timeout=60) == 1  # one call
    with pytest.raises(ember.ConflictError, match="Idempotency-Key"):  # the key names that input, no other
        keyed.spawn({"value": 2})
    assert fn.spawn({"value": 1}).call_id != first.call_id  # the original handle is unchanged
    with pytest.raises(TypeError, match=r"only \.spawn"):
        keyed.remote({"value": 1})
    with pytest.raises(TypeError, match=r"only \.spawn"):
        keyed.map([1])
    assert fn.with_options(timeout_s=30).remote({"value": 3}) == 3
    with pytest.raises(ember.DeadlineExceededError):  # the timeout reaches the platform
        fn.with_options(timeout_s=0.5).remote({"sleep": 5, "value": 4})


def test_user_keyword_arguments_never_collide_with_options(steer: AppView, ember_url: str) -> None:
    app = ember.App("steer")

    @app.function()
    def add(a: int, b: int = 0) -> int:
        return a + b

    assert add.spawn(a=1, b=2).get(timeout=60) == 3
    assert list(add.map([{"a": 1, "b": 1}, {"a": 2}])) == [2, 2]


# --- map ---------------------------------------------------------------------------------------


def test_map_keeps_a_bounded_number_in_flight(fn: ember.FunctionHandle) -> None:
    group = uuid.uuid4().hex  # these calls, counted apart from any other test's
    pulled = 0

    def inputs() -> Iterator[dict[str, Any]]:
        nonlocal pulled
        for i in range(16):
            pulled += 1
            yield {"sleep": 0.2, "value": i, "group": group}

    results = fn.map(inputs(), max_concurrency=4)
    assert pulled == 0  # nothing is submitted before the first result is asked for
    first = next(results)
    assert first == 0 and pulled <= 4 + 1
    assert [first, *results] == list(range(16))
    assert 1 <= fn.remote({"peak": group}) <= 4  # what the function saw at once


def test_map_reads_an_endless_iterable_lazily(fn: ember.FunctionHandle) -> None:
    results = fn.map(({"value": i} for i in itertools.count()), max_concurrency=3)
    assert list(itertools.islice(results, 5)) == [0, 1, 2, 3, 4]
    results.close()


def test_map_in_order_and_as_completed(fn: ember.FunctionHandle) -> None:
    inputs = [{"sleep": 0.5 * (4 - i), "value": i} for i in range(4)]
    assert list(fn.map(inputs, max_concurrency=4)) == [0, 1, 2, 3]
    assert list(fn.map(inputs, max_concurrency=4, order=False)) == [3, 2, 1, 0]


def test_map_raises_the_first_failure_in_its_turn(fn: ember.FunctionHandle) -> None:
    results = fn.map([{"value": 0}, {"fail": "no"}, {"value": 2}], max_concurrency=2)
    assert next(results) == 0
    with pytest.raises(ember.RemoteError, match="no"):
        next(results)


# --- async forms -------------------------------------------------------------------------------


def test_async_forms(fn: ember.FunctionHandle) -> None:
    one = ember.lookup("steer", "one")

    async def main() -> None:
        assert await fn.remote.aio({"value": 1}) == 1
        assert await _typed().remote.aio(Point(1, 1)) == Point(1, 1)
        call = await one.spawn.aio(3.0)
        await asyncio.to_thread(wait_for, lambda: call.status() == "running", 60, "the call to start")
        assert await call.status.aio() == "running"
        held = await one.spawn.aio(0.1)  # queued behind it
        with pytest.raises(ember.DeadlineExceededError):
            await held.get.aio(timeout=0.3)
        assert await held.cancel.aio() is True
        assert (await held.record.aio()).status == "cancelled"
        assert await call.get.aio(timeout=60) == 3.0
        assert await call.cancel.aio() is False

    asyncio.run(main())


def test_async_map_is_bounded_ordered_or_as_completed(fn: ember.FunctionHandle) -> None:
    group = uuid.uuid4().hex

    async def main() -> None:
        inputs = [{"sleep": 0.3 * (8 - i), "value": i, "group": group} for i in range(8)]
        assert [r async for r in fn.map.aio(inputs, max_concurrency=3)] == list(range(8))
        assert 1 <= await fn.remote.aio({"peak": group}) <= 3
        unordered = [r async for r in fn.map.aio(inputs[4:], max_concurrency=4, order=False)]
        assert unordered == [7, 6, 5, 4]
        with pytest.raises(ember.RemoteError):
            async for _ in fn.map.aio([{"value": 0}, {"fail": "no"}]):
                pass

    asyncio.run(main())


def test_leaving_an_async_map_early_cancels_its_calls(fn: ember.FunctionHandle) -> None:
    async def main() -> None:
        inputs = [{"value": 0}, *({"sleep": 30, "value": i} for i in range(1, 5))]
        async with aclosing(fn.map.aio(inputs, max_concurrency=5)) as results:
            async for first in results:
                assert first == 0
                break
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(main())  # returns without waiting for the 30 s calls


def test_async_errors_are_embers_own(steer: AppView, ember_url: str) -> None:
    async def main() -> None:
        with pytest.raises(ember.NotFoundError):
            await ember.FunctionCall.from_id(uuid.uuid4().hex).get.aio()

    asyncio.run(main())


# --- the CLI -----------------------------------------------------------------------------------


def test_cli_call_async_and_calls_get(steer: AppView, platform: Any, ember_cli: Any) -> None:
    call_id = ember_cli("call", "steer.f", "--data", '{"sleep": 0.2, "value": [1, 2]}', "--async", "--timeout",
                        "9", url=platform.url).stdout.strip()
    record = json.loads(ember_cli("calls", "get", call_id, "--wait", "60", url=platform.url).stdout)
    assert (record["call_id"], record["status"], record["output"]) == (call_id, "succeeded", [1, 2])


def test_cli_calls_cancel(steer: AppView, platform: Any, ember_cli: Any, ember_url: str) -> None:
    one = ember.lookup("steer", "one")
    running = _busy(one, 120.0)  # async: its cancel below ends it; until then three CLI processes start, however slowly
    held = one.spawn(0.1)
    assert ember_cli("calls", "cancel", held.call_id, url=platform.url).stdout.strip() == f"cancelled {held.call_id}"
    late = ember_cli("calls", "cancel", held.call_id, url=platform.url, check=False)
    assert late.returncode == 1 and "is cancelled already; only a queued or running call" in late.stderr
    assert ember_cli("calls", "cancel", running.call_id, url=platform.url).stdout.strip() == \
        f"cancelled {running.call_id}"
    missing = ember_cli("calls", "get", uuid.uuid4().hex, url=platform.url, check=False)
    assert missing.returncode == 1 and "NotFoundError" in missing.stderr


def test_cli_dead_letters_and_replay(steer: AppView, platform: Any, ember_cli: Any, ember_url: str) -> None:
    assert ember_cli("calls", "dead", "steer.add", url=platform.url).stdout.strip() == "no dead letters for steer.add"
    message = "division by zero\nat line 3 " + "x" * 80
    failed = [ember.lookup("steer", "f").spawn({"fail": message}) for _ in range(2)]
    for call in failed:
        with pytest.raises(ember.RemoteError):
            call.get(timeout=60)
    ids = [c.call_id for c in failed]
    listed = wait_for(lambda: [line for line in ember_cli("calls", "dead", "steer.f", url=platform.url)
                               .stdout.splitlines() if line.split()[:1] and line.split()[0] in ids], 30,
                      "the dead letters to be listed")
    assert listed[0].split()[0] in ids and "ValueError: division by zero at line 3" in listed[0]
    assert listed[0].split()[1] == "1" and "..." in listed[0]
    (replayed,) = ember_cli("calls", "replay", "steer.f", "--id", ids[1], url=platform.url).stdout.split()
    assert replayed not in ids
    with pytest.raises(ember.RemoteError, match="division by zero"):
        ember.FunctionCall.from_id(replayed).get(timeout=60)
    (again,) = ember.lookup("steer", "f").replay([ids[0]])
    with pytest.raises(ember.RemoteError, match="division by zero"):
        again.get(timeout=60)
