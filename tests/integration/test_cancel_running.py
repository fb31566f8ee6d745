"""Cancelling calls that already run, against the real platform: an ``async def`` function's task is cancelled, a
generator closed at its next item, a sync function told through ``ember.current_call().cancelled``, a batched call
leaves its batch while the rest complete, a parent's cancel reaches the call it waits on, and ``terminate`` replaces
a replica whose code never looks, without losing its other calls. The record says who cancelled and when. A call
made with ``POST`` and answered in the same request is cancelled by its client going away, the calls it waits on
with it."""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from support.paths import REPO
from support.polling import wait_for

import ember
from ember._client import Transport
from ember._deploy import app_view
from ember.wire import HTTP_CALL_ID_HEADER, AppView

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
APP = REPO / "tests" / "apps" / "cancel" / "stoppable.py"


PLATFORM_LOG: list[Path] = []  # the control plane's log, for what a wait that timed out says


@pytest.fixture(scope="module")
def cancels(deployed, platform) -> AppView:
    PLATFORM_LOG[:] = [platform.log_dir / "platform.log"]
    return deployed(APP)


@pytest.fixture
def sdk(cancels, ember_url):
    return cancels


def _notes(cls: str = "Stoppable") -> list[str]:
    return ember.lookup("cancels", f"{cls}.events").remote()


def _started(tag: str, cls: str = "Stoppable") -> None:
    wait_for(lambda: f"started:{tag}" in _notes(cls), timeout_s=60, what=f"{tag} to start", explain=_explain)


def _explain() -> str:
    """What the replicas noted last, and which of them run: for a wait that timed out."""
    transport = Transport(os.environ["EMBER_URL"], token=os.environ["EMBER_TOKEN"])
    try:
        replicas = [(s.name, r.replica_id, r.state, r.restarts) for s in app_view(transport, "cancels").services
                    for r in s.replicas]
    finally:
        transport.close()
    said = [line for path in PLATFORM_LOG for line in path.read_text(errors="replace").splitlines()
            if "cancel" in line or "stream" in line or "Error" in line]
    return (f"Stoppable noted {_notes()[-12:]}\nKid noted {_notes('Kid')[-12:]}\nreplicas {replicas}\n"
            "the control plane's log:\n" + "\n".join(said[-15:]))


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def test_an_async_functions_task_is_cancelled_and_the_record_says_who_and_when(sdk, http: httpx.Client) -> None:
    tag = _tag()
    call = ember.lookup("cancels", "Stoppable.spin_async").spawn(tag)
    _started(tag)
    before = time.time()
    answer = http.delete(f"/v1/calls/{call.call_id}")
    assert answer.status_code == 200, answer.text
    record = answer.json()
    assert record["status"] == "cancelled" and record["cancelled_by"]  # the token's id
    assert before <= record["cancelled_at"] <= time.time()
    assert record["error"]["code"] == "cancelled" and "while running" in record["error"]["message"]
    wait_for(lambda: f"cancelled:{tag}" in _notes(), timeout_s=30, what="the task's CancelledError")
    with pytest.raises(ember.CallCancelledError):
        call.get(timeout=5)
    assert call.record().status == "cancelled"  # the replica's own settle lost to the cancel's record
    again = http.delete(f"/v1/calls/{call.call_id}")  # final: nothing more to cancel
    assert again.status_code == 409, again.text
    # the replica serves the next call
    assert ember.lookup("cancels", "Stoppable.spin_async").spawn(tag + "x").cancel() is True


def test_a_sync_function_is_told_and_its_replica_serves_the_next_call(sdk) -> None:
    tag = _tag()
    call = ember.lookup("cancels", "Stoppable.spin_sync").spawn(tag)
    _started(tag)
    assert call.cancel() is True
    wait_for(lambda: f"noticed:{tag}" in _notes(), timeout_s=30, what="the sync code to see cancelled")
    assert call.record().status == "cancelled"
    follow = ember.lookup("cancels", "Stoppable.spin_sync").spawn(tag + "b")  # the model thread is free again
    _started(tag + "b")
    assert follow.cancel() is True
    assert call.cancel() is False  # already final


def test_a_generator_is_closed_at_its_next_item(sdk) -> None:
    tag = _tag()
    call = ember.lookup("cancels", "Stoppable.items").spawn(tag)
    wait_for(lambda: f"item:{tag}:3" in _notes(), timeout_s=60, what="some items")
    assert call.cancel() is True
    wait_for(lambda: f"closed:{tag}" in _notes(), timeout_s=30, what="the generator's close")
    notes = _notes()
    made = [n for n in notes if n.startswith(f"item:{tag}:")]
    assert call.record().status == "cancelled"
    time.sleep(0.2)
    assert [n for n in _notes() if n.startswith(f"item:{tag}:")] == made  # no item after the close


def test_a_cancelled_input_leaves_its_batch_and_the_rest_complete(sdk) -> None:
    tags = [_tag() for _ in range(4)]
    fn = ember.lookup("cancels", "Stoppable.batched")
    calls = dict(zip(tags, (fn.spawn(t) for t in tags), strict=True))

    def shared_batch() -> list[str]:  # a batch of two or more of these calls, as it starts
        for note in (n for n in _notes() if n.startswith("batch:")):
            ours = [t for t in note.removeprefix("batch:").split(",") if t in calls]
            if len(ours) >= 2:
                return ours
        return []

    batch = wait_for(shared_batch, timeout_s=60, what="a batch of several calls")
    gone, *rest = batch
    assert calls[gone].cancel() is True
    assert calls[gone].record().status == "cancelled"
    assert [calls[t].get(timeout=60) for t in rest] == [f"done:{t}" for t in rest]
    assert calls[gone].record().status == "cancelled"


def test_cancelling_a_parent_cancels_the_call_it_waits_on(sdk) -> None:
    tag = _tag()
    call = ember.lookup("cancels", "Stoppable.parent").spawn(tag)
    _started(tag, "Kid")  # the child runs in the Kid replica
    assert call.cancel() is True
    wait_for(lambda: f"cancelled:{tag}" in _notes("Kid"), timeout_s=30, what="the child's cancel")
    wait_for(lambda: f"child-ended:{tag}:cancelled" in _notes(), timeout_s=30, what="the parent to see it")
    assert call.record().status == "cancelled"


def test_a_cancelled_call_makes_no_more_calls(sdk) -> None:
    tag = _tag()
    call = ember.lookup("cancels", "Stoppable.late_parent").spawn(tag)
    _started(tag)
    assert call.cancel() is True
    wait_for(lambda: f"late-call-ended:{tag}:cancelled" in _notes(), timeout_s=30, what="the late call's refusal",
             explain=_explain)
    assert f"started:{tag}" not in _notes("Kid")  # never sent, so never run to Kid's timeout
    assert call.record().status == "cancelled"


def test_a_batchs_call_is_cancelled_only_once_every_call_of_the_batch_is(sdk) -> None:
    calls = {tag: ember.lookup("cancels", "Stoppable.batch_parent").spawn(tag) for tag in (_tag() for _ in range(4))}

    def shared_batch() -> tuple[list[str], str] | None:  # a batch of two or more of these calls, its first call's id
        for note in (n for n in _notes() if n.startswith("batch-parent:")):
            kid, first = note.removeprefix("batch-parent:").split(":")
            if set(kid.split("-")) <= set(calls):
                return kid.split("-"), first
        return None

    batch, first = wait_for(shared_batch, timeout_s=60, what="a batch of several calls")
    kid = "-".join(batch)
    _started(kid, "Kid")
    gone = next(tag for tag in batch if calls[tag].call_id == first)  # the call the batch's call is filed under
    assert calls[gone].cancel() is True
    time.sleep(2)
    assert f"cancelled:{kid}" not in _notes("Kid"), "the batch's call, which its other calls wait on, was cancelled"
    for tag in batch:
        if tag != gone:
            assert calls[tag].cancel() is True  # still running
    wait_for(lambda: f"cancelled:{kid}" in _notes("Kid"), timeout_s=30, what="the child's cancel", explain=_explain)
    wait_for(lambda: f"batch-child-ended:{kid}:cancelled" in _notes(), timeout_s=30, what="the batch to see it")
    for tag in set(calls) - set(batch):  # any other batch's
        calls[tag].cancel()


@contextlib.contextmanager
def _posted(url: str, token: str, path: str, body: bytes) -> Iterator[None]:
    """POST ``body`` to ``path`` on a connection of its own; on leaving the block, close it unanswered (a client
    that goes away)."""
    where = urlsplit(url)
    head = (f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    with socket.create_connection((where.hostname, where.port), timeout=30) as conn:
        conn.sendall(head.encode() + body)
        yield


@pytest.mark.parametrize("parent", ["parent", "aparent"])
def test_a_client_that_leaves_a_sync_call_cancels_the_call_it_waits_on(sdk, platform, parent) -> None:
    tag = _tag()
    with _posted(platform.url, platform.token, f"/v1/cancels/Stoppable.{parent}", f'"{tag}"'.encode()):
        _started(tag, "Kid")  # the child runs in the Kid replica
    wait_for(lambda: f"cancelled:{tag}" in _notes("Kid"), timeout_s=30, what="the child's cancel")
    ended = f"child-ended:{tag}:cancelled" if parent == "parent" else f"parent-ended:{tag}"
    wait_for(lambda: ended in _notes(), timeout_s=30, what="the parent to end")
    _serves_the_next_call(tag)


def test_a_client_that_leaves_a_stream_cancels_the_call_it_waits_on(sdk, platform, http: httpx.Client) -> None:
    tag = _tag()
    with http.stream("POST", "/v1/cancels/Stoppable.gen_parent", json=tag) as response:
        assert response.status_code == 200
        lines = response.iter_lines()  # kept: an iterator dropped is closed, and closes the connection with it
        assert next(filter(None, lines))  # the first item
        _started(tag, "Kid")
        call_id = response.headers[HTTP_CALL_ID_HEADER]
        assert f"stream {call_id} " not in PLATFORM_LOG[0].read_text(errors="replace")  # not left before the child
    wait_for(lambda: f"cancelled:{tag}" in _notes("Kid"), timeout_s=30, what="the child's cancel")
    wait_for(lambda: f"child-ended:{tag}:cancelled" in _notes(), timeout_s=30, what="the parent to end")
    logged = PLATFORM_LOG[0].read_text(errors="replace")  # the control plane says why the call ended
    assert f"stream {call_id} of cancels.Stoppable.gen_parent left after 1 item(s)" in logged
    _serves_the_next_call(tag)


def _serves_the_next_call(tag: str) -> None:
    """Stoppable's replica runs a sync call at once: the model thread is free again."""
    follow = ember.lookup("cancels", "Stoppable.spin_sync").spawn(tag + "n")
    wait_for(lambda: f"started:{tag}n" in _notes(), timeout_s=20, what="the next call to start")
    assert follow.cancel() is True


def test_terminate_replaces_the_replica_without_losing_its_other_calls(sdk, http: httpx.Client) -> None:
    def stubborn() -> list[tuple[str, float]]:  # its ready processes (a restarted replica keeps its id)
        view = http.get("/v1/apps/cancels").json()
        return [(r["replica_id"], r["started_at"]) for s in view["services"] if s["name"] == "Stubborn"
                for r in s["replicas"] if r["state"] == "ready"]

    before = wait_for(stubborn, timeout_s=60, what="a Stubborn replica")
    tag = _tag()
    stuck = ember.lookup("cancels", "Stubborn.forever").spawn(tag)
    wait_for(lambda: stuck.status() == "running", timeout_s=60, what="forever to run")
    waiting = ember.lookup("cancels", "Stubborn.quick").spawn(7)  # behind it, on the same replica
    answer = http.delete(f"/v1/calls/{stuck.call_id}", params={"terminate": "yes"})
    assert answer.status_code == 400 and answer.json()["error"]["field"] == "terminate", answer.text
    answer = http.delete(f"/v1/calls/{stuck.call_id}", params={"terminate": "true"})
    assert answer.status_code == 200 and answer.json()["status"] == "cancelled", answer.text
    assert waiting.get(timeout=120) == 7  # retried on the replacement
    wait_for(lambda: (now := stubborn()) and not set(now) & set(before), timeout_s=120,
             what="a new process in place of the terminated one")
    assert stuck.record().status == "cancelled"
