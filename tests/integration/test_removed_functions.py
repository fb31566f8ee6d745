"""Queued calls of a function that the app no longer has: once no version taking calls has it (a push without it has
switched, a canary without it was promoted), each call waiting in its queue is ``cancelled``, saying in which version
the function was removed, its message is gone from ``EMBER_CALLS`` and its consumer deleted; a canary beside a
stable version that has it changes nothing, a rollback brings its queue back, and calls pinned to a kept version
stay. ``ember delete`` cancels and removes every queued call of every function the app ever had, and nothing of
another app. Its function ``g`` asks for a GPU no node has: its calls wait in the queue for good."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.js.errors import NotFoundError as JsNotFound
from support.natsconn import connect as admin_connect
from support.polling import wait_for

import ember
from ember._client import Transport
from ember._deploy import deploy
from ember.wire import CALL_ID_HEADER, CallRecord, subjects
from ember.wire.callstore import CallStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

KEPT = '''
@app.function(min_replicas=0, max_replicas=1)
def f(x: int) -> int:
    return x
'''
WAITS = '''
@app.function(gpu="B300", min_replicas=0, max_replicas=1)  # no node has one: its calls stay queued
def g(x: int) -> int:
    return x
'''


def write(folder: Path, app: str, *parts: str) -> Path:
    path = folder / f"{app.replace('-', '_')}.py"
    path.write_text(f'import ember\napp = ember.App("{app}")\n' + "".join(parts))
    return path


def spawn(http: httpx.Client, target: str, fn: str, x: int) -> str:
    response = http.post(f"/v1/{target}/{fn}/spawn", json=x)
    assert response.status_code == 202, response.text
    return response.json()["call_id"]


def record(http: httpx.Client, call_id: str) -> dict:
    response = http.get(f"/v1/calls/{call_id}")
    assert response.status_code == 200, response.text
    return response.json()


def final(http: httpx.Client, call_id: str) -> dict:
    return wait_for(lambda: (r := record(http, call_id))["status"] != "queued" and r, timeout_s=60,
                    what=f"call {call_id} to leave the queue")


def nats(url: str, look: Any) -> Any:
    """``look(js)`` on an admin connection to the platform's NATS."""
    async def run() -> Any:
        nc = await admin_connect(url)
        try:
            return await look(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(run())


async def _queued(js: Any, subject: str) -> list[str]:
    """The call ids of the messages on ``subject`` (wildcards allowed) of the calls' stream."""
    ids: list[str] = []
    seq = 1
    while True:
        try:
            msg = await js.get_msg(subjects.CALLS_STREAM, seq=seq, subject=subject, next=True)
        except JsNotFound:
            return ids
        seq = (msg.seq or seq) + 1
        ids.append((msg.headers or {}).get(CALL_ID_HEADER, ""))


def queued(url: str, subject: str) -> list[str]:
    return nats(url, lambda js: _queued(js, subject))


def consumers(url: str, app: str) -> set[str]:
    """The names of the calls' stream's consumers that take ``app``'s calls."""
    async def look(js: Any) -> set[str]:
        names: set[str] = set()
        offset = 0
        while page := await js.consumers_info(subjects.CALLS_STREAM, offset=offset):
            offset += len(page)
            names |= {c.name for c in page if (c.config.filter_subject or "").startswith(f"ember.calls.default.{app}.")}
        return names

    return nats(url, look)


def queues_of(app: str) -> str:
    return f"ember.calls.default.{app}.>"


def has_stream(url: str, name: str) -> bool:
    async def look(js: Any) -> bool:
        try:
            await js.stream_info(name)
        except JsNotFound:
            return False
        return True

    return nats(url, look)


def leave_stray(url: str, app: str) -> str:
    """A queued call of ``app``'s function ``old``, which no version of it has, and that function's consumer."""
    call_id = f"{app}_{uuid.uuid4().hex}"

    async def leave(js: Any) -> None:
        store = CallStore(js, *[await js.key_value(name) for name in (subjects.CALLS_BUCKET, subjects.RESULTS_BUCKET)])
        await store.create_status(CallRecord(call_id=call_id, app=app, function="old", status="queued",
                                             created_at=1.0, updated_at=1.0))
        await js.publish(subjects.calls(app, "old"), b"1", headers={CALL_ID_HEADER: call_id})
        await js.add_consumer(subjects.CALLS_STREAM, durable_name=subjects.calls_consumer(app, "old"),
                              filter_subject=subjects.calls(app, "old"))

    nats(url, leave)
    return call_id


def test_a_push_without_a_function_cancels_its_queued_calls_and_keeps_the_pinned_ones(
        platform, transport: Transport, http: httpx.Client, ember_url: str, ember_cli, tmp_path: Path) -> None:
    app = f"gone-{uuid.uuid4().hex[:6]}"
    bound = WAITS.replace('min_replicas=0', f'on="events.{app}.g", min_replicas=0')  # its events: a stream of its own
    deploy(write(tmp_path, app, KEPT, bound), transport=transport, timeout_s=120)
    assert has_stream(platform.nats_url, subjects.events_stream(app, "g"))
    try:
        waiting = [spawn(http, app, "g", 1), ember.lookup(app, "g").spawn(2).call_id]
        pinned = spawn(http, f"{app}@1", "g", 3)  # waits in version 1's own queue, kept for rollback
        assert sorted(queued(platform.nats_url, subjects.calls(app, "g"))) == sorted(waiting)
        assert subjects.calls_consumer(app, "g") in consumers(platform.nats_url, app)

        deploy(write(tmp_path, app, KEPT), transport=transport, timeout_s=120)  # v2, without g: it takes the traffic

        for call_id in waiting:
            done = final(http, call_id)
            assert done["status"] == "cancelled", done
            assert done["error"]["code"] == "cancelled"
            assert f"the function 'g' was removed from the app '{app}' in version 2" in done["error"]["message"]
        with pytest.raises(ember.CallCancelledError, match=r"removed from the app .* in version 2"):
            ember.FunctionCall.from_id(waiting[1]).get(timeout=10)
        assert queued(platform.nats_url, subjects.calls(app, "g")) == []
        assert subjects.calls_consumer(app, "g") not in consumers(platform.nats_url, app)
        assert not has_stream(platform.nats_url, subjects.events_stream(app, "g"))
        # version 1 is kept (for rollback): what is pinned to it waits still, and so does its queue
        assert record(http, pinned)["status"] == "queued"
        assert queued(platform.nats_url, subjects.pinned_calls(app, "g", 1)) == [pinned]
        assert subjects.pinned_calls_consumer(app, "g", 1) in consumers(platform.nats_url, app)
        assert http.post(f"/v1/{app}/f", json=5).json() == 5  # the function kept is untouched

        ember_cli("delete", app, url=platform.url)
        done = final(http, pinned)
        assert done["status"] == "cancelled" and f"the app '{app}' was deleted" in done["error"]["message"]
        assert queued(platform.nats_url, queues_of(app)) == []
        assert consumers(platform.nats_url, app) == set()
    finally:
        http.delete(f"/v1/apps/{app}")


def test_a_canary_without_a_function_keeps_it_until_promoted_and_a_rollback_brings_it_back(
        platform, transport: Transport, http: httpx.Client, ember_cli, tmp_path: Path) -> None:
    app = f"canary-gone-{uuid.uuid4().hex[:6]}"
    deploy(write(tmp_path, app, KEPT, WAITS), transport=transport, timeout_s=120)
    try:
        first = spawn(http, app, "g", 1)
        deploy(write(tmp_path, app, KEPT), transport=transport, timeout_s=120, canary_percent=50)
        # version 1 still takes half the calls, g among them: its queue stays
        assert record(http, first)["status"] == "queued"
        assert queued(platform.nats_url, subjects.calls(app, "g")) == [first]
        assert subjects.calls_consumer(app, "g") in consumers(platform.nats_url, app)

        ember_cli("promote", app, url=platform.url)
        done = final(http, first)
        assert done["status"] == "cancelled", done
        assert f"the function 'g' was removed from the app '{app}' in version 2" in done["error"]["message"]
        assert queued(platform.nats_url, subjects.calls(app, "g")) == []
        assert subjects.calls_consumer(app, "g") not in consumers(platform.nats_url, app)

        ember_cli("rollback", app, "--to", "1", url=platform.url)  # g is back: its queue with it
        wait_for(lambda: subjects.calls_consumer(app, "g") in consumers(platform.nats_url, app), timeout_s=30,
                 what="g's consumer to be made again")
        again = spawn(http, app, "g", 2)
        assert queued(platform.nats_url, subjects.calls(app, "g")) == [again]
        assert record(http, again)["status"] == "queued"
    finally:
        http.delete(f"/v1/apps/{app}")


def test_deleting_an_app_cancels_the_calls_of_every_function_it_ever_had_and_no_other_apps(
        platform, transport: Transport, http: httpx.Client, ember_cli, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    app, neighbour = f"del-{tag}", f"del-{tag}-x"  # the neighbour's name begins with the app's
    deploy(write(tmp_path, app, KEPT, WAITS), transport=transport, timeout_s=120)
    deploy(write(tmp_path, neighbour, KEPT, WAITS), transport=transport, timeout_s=120)
    try:
        mine, theirs = spawn(http, app, "g", 1), spawn(http, neighbour, "g", 1)
        # a call left in the queue of a function no version of the app has had for long (as an older platform left
        # them), with its consumer: only the whole app's queues find it
        stray = leave_stray(platform.nats_url, app)
        assert subjects.calls_consumer(app, "old") in consumers(platform.nats_url, app)

        ember_cli("delete", app, url=platform.url)

        for call_id in (mine, stray):
            done = final(http, call_id)
            assert done["status"] == "cancelled" and f"the app '{app}' was deleted" in done["error"]["message"]
        assert queued(platform.nats_url, queues_of(app)) == []
        assert consumers(platform.nats_url, app) == set()
        # the neighbour's call, queue and consumer are untouched
        assert record(http, theirs)["status"] == "queued"
        assert queued(platform.nats_url, queues_of(neighbour)) == [theirs]
        assert subjects.calls_consumer(neighbour, "g") in consumers(platform.nats_url, neighbour)
    finally:
        http.delete(f"/v1/apps/{app}")
        http.delete(f"/v1/apps/{neighbour}")


def test_a_call_left_in_the_queue_of_a_function_long_gone_is_cancelled_at_the_next_push(
        platform, transport: Transport, http: httpx.Client, tmp_path: Path) -> None:
    app = f"stray-{uuid.uuid4().hex[:6]}"
    deploy(write(tmp_path, app, KEPT), transport=transport, timeout_s=120)
    try:
        stray = leave_stray(platform.nats_url, app)
        deploy(write(tmp_path, app, KEPT, "\n# v2\n"), transport=transport, timeout_s=120)
        done = final(http, stray)
        assert done["status"] == "cancelled", done
        assert done["error"]["message"] == (f"the function 'old' was removed from the app '{app}' (version 2 has none) "
                                            "before the call ran")
        assert queued(platform.nats_url, subjects.calls(app, "old")) == []
        assert subjects.calls_consumer(app, "old") not in consumers(platform.nats_url, app)
        assert subjects.calls_consumer(app, "f") in consumers(platform.nats_url, app)
    finally:
        http.delete(f"/v1/apps/{app}")


def test_a_delete_cancels_every_waiting_call_though_one_record_is_not_a_call_record(
        platform, transport: Transport, http: httpx.Client, tmp_path: Path) -> None:
    """A call's status record the app's own replica overwrote with what is no record (its own app's keys are its to
    write): that call is no call's any more, and the others are cancelled all the same. The undecodable record
    stopped the walk: the delete answered 500, and the calls after it stayed queued, their messages kept."""
    app = f"spoilt-{uuid.uuid4().hex[:6]}"
    deploy(write(tmp_path, app, WAITS), transport=transport, timeout_s=120)
    first, second = spawn(http, app, "g", 1), spawn(http, app, "g", 2)

    async def spoil(js: Any) -> None:
        await (await js.key_value(subjects.CALLS_BUCKET)).put(subjects.call_key("s", app, first), b"not a record")

    nats(platform.nats_url, spoil)
    assert http.get(f"/v1/calls/{first}").status_code == 404  # no call's record: an unknown call, not a 500
    deleted = http.delete(f"/v1/apps/{app}")
    assert deleted.status_code == 204, deleted.text
    done = final(http, second)
    assert done["status"] == "cancelled" and f"the app '{app}' was deleted" in done["error"]["message"]
    assert queued(platform.nats_url, queues_of(app)) == []
