"""The SDK's and the CLI's asynchronous calls against the real platform: spawn, get, status, cancel,
idempotency, deadlines, map, the ``.aio`` forms, dead letters and replay."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

import pytest
from support.paths import REPO

import ember

pytestmark = pytest.mark.integration


def wait_for_status(call: ember.FunctionCall, status: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (current := call.status()) != status:
        assert time.monotonic() < deadline, f"{call} stayed {current}, never {status}"
        time.sleep(0.05)


@pytest.fixture
def hello_module(hello, ember_url, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples" / "hello"))
    import hello as hello_app  # the user's own module: typed handles

    yield hello_app
    sys.modules.pop("hello", None)


def test_spawn_get_and_status(hello, ember_url):
    greet = ember.lookup("hello", "greet")
    call = greet.spawn("Ada")
    assert isinstance(call, ember.FunctionCall) and len(call.call_id) >= 16
    assert call.status() in {"queued", "running", "succeeded"}
    assert call.get(timeout=60) == "Hello, Ada!"
    assert call.status() == "succeeded"
    again = ember.FunctionCall.from_id(call.call_id)
    assert again.get(timeout=0) == "Hello, Ada!"
    assert again.record().attempts == 1


def test_spawn_is_typed_through_the_decorated_function(hello_module):
    assert hello_module.norm.spawn(hello_module.Point(3, 4)).get(timeout=60) == 5.0
    assert hello_module.add.spawn(2, b=40).get(timeout=60) == 42
    assert hello_module.echo.spawn({"k": 1}).get(timeout=60) == {"k": 1}  # one input of a batched function


def test_spawn_validates_at_once(hello, ember_url):
    with pytest.raises(ember.InvalidInputError):
        ember.lookup("hello", "norm").spawn({"x": 1})
    with pytest.raises(ember.NotFoundError):
        ember.lookup("hello", "nosuchfn").spawn(1)
    with pytest.raises(ember.NotFoundError):
        ember.FunctionCall.from_id(uuid.uuid4().hex).status()


def test_the_same_idempotency_key_is_one_call(hello, ember_url):
    greet = ember.lookup("hello", "greet").with_options(idempotency_key=f"sdk-{uuid.uuid4().hex}")
    first, second = greet.spawn("Bo"), greet.spawn("Bo")
    assert first.call_id == second.call_id
    assert second.get(timeout=60) == "Hello, Bo!"


def test_get_raises_the_calls_error(probe, ember_url):
    call = ember.lookup("probe", "boom").spawn("sdk-boom")
    with pytest.raises(ember.RemoteError) as info:
        call.get(timeout=60)
    assert info.value.remote_type == "ValueError" and info.value.message == "sdk-boom"
    assert info.value.call_id == call.call_id
    assert call.status() == "failed"


def test_get_with_a_timeout_leaves_the_call_running(probe, ember_url):
    call = ember.lookup("probe", "slow").spawn(1.0)
    with pytest.raises(ember.DeadlineExceededError, match="still"):
        call.get(timeout=0.2)
    assert call.get(timeout=60) == 1.0


def test_cancel_a_queued_call_but_not_a_finished_one(probe, ember_url):
    slow = ember.lookup("probe", "slow")
    busy = slow.spawn(1.5)
    wait_for_status(busy, "running")
    queued = slow.spawn(0.33)
    assert queued.cancel() is True
    assert queued.status() == "cancelled"
    assert queued.cancel() is False
    with pytest.raises(ember.EmberError, match="cancelled"):
        queued.get(timeout=10)
    assert busy.get(timeout=60) == 1.5
    assert busy.cancel() is False  # finished


def test_a_deadline_passed_in_the_queue_expires_the_call(probe, ember_url):
    slow = ember.lookup("probe", "slow")
    busy = slow.spawn(1.2)
    late = slow.with_options(timeout_s=0.3).spawn(0.34)
    assert busy.get(timeout=60) == 1.2
    with pytest.raises(ember.DeadlineExceededError):
        late.get(timeout=60)
    assert late.status() == "expired"


def test_map_in_order_and_as_completed(hello, ember_url):
    add = ember.lookup("hello", "add")
    inputs = [{"a": i, "b": 1} for i in range(20)]
    assert list(add.map(inputs, max_concurrency=4)) == list(range(1, 21))
    unordered = list(add.map(inputs, max_concurrency=8, order=False))
    assert sorted(unordered) == list(range(1, 21))


def test_async_forms(hello_module):
    async def main() -> None:
        assert await hello_module.greet.remote.aio("Cy") == "Hello, Cy!"
        call = await hello_module.norm.spawn.aio(hello_module.Point(6, 8))
        assert await call.get.aio(timeout=60) == 10.0
        assert await call.status.aio() == "succeeded"
        assert await call.cancel.aio() is False
        results = [r async for r in hello_module.add.map.aio([{"a": i} for i in range(10)], max_concurrency=3)]
        assert results == list(range(10))
        unordered = [r async for r in hello_module.add.map.aio([{"a": i} for i in range(10)], order=False)]
        assert sorted(unordered) == list(range(10))

    asyncio.run(main())


def test_cli_call_async_calls_get_and_cancel(hello, platform, ember_cli):
    call_id = ember_cli("call", "hello.greet", "--data", '"Di"', "--async", url=platform.url).stdout.strip()
    record = json.loads(ember_cli("calls", "get", call_id, "--wait", "60", url=platform.url).stdout)
    assert (record["call_id"], record["status"], record["output"]) == (call_id, "succeeded", "Hello, Di!")
    late = ember_cli("calls", "cancel", call_id, url=platform.url, check=False)
    assert late.returncode == 1 and "is succeeded" in late.stderr
    missing = ember_cli("calls", "get", uuid.uuid4().hex, url=platform.url, check=False)
    assert missing.returncode == 1 and "NotFoundError" in missing.stderr


def test_dead_letters_and_replay_through_the_sdk_and_the_cli(probe, platform, ember_url, ember_cli):
    flaky = ember.lookup("probe", "flaky")
    poison = flaky.spawn(f"poison-sdk-{uuid.uuid4().hex[:8]}")
    with pytest.raises(ember.RemoteError, match="poisoned"):
        poison.get(timeout=60)
    assert poison.call_id in {letter.call_id for letter in flaky.dead_letters()}
    listed = ember_cli("calls", "dead", "probe.flaky", url=platform.url).stdout
    row = next(line for line in listed.splitlines() if line.startswith(poison.call_id))
    assert row.split()[1] == "3" and "RuntimeError: poisoned" in row
    replayed = ember_cli("calls", "replay", "probe.flaky", "--id", poison.call_id, url=platform.url)
    (new_id,) = replayed.stdout.split()
    assert new_id != poison.call_id
    with pytest.raises(ember.RemoteError, match="poisoned"):
        ember.FunctionCall.from_id(new_id).get(timeout=60)
    ids = {letter.call_id for letter in flaky.dead_letters()}
    assert poison.call_id not in ids and new_id in ids
    (again,) = flaky.replay([new_id])
    with pytest.raises(ember.RemoteError, match="poisoned"):
        again.get(timeout=60)
