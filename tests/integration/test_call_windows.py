"""Windows that could lose or duplicate queued work: a replica killed between a call's final record and its
dead letter or event result, an app deleted with calls still queued, replays that race, and reading the dead
letters (no consumer per read, paged)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path

import httpx
import nats
import pytest
from support.auth import authed_client
from support.calls import result, spawn
from support.natsconn import connect as admin_connect
from support.platform import TestPlatform
from support.polling import wait_for

import ember
from ember._client import Transport
from ember.wire import natsflush, subjects

pytestmark = pytest.mark.integration
FINAL = {"succeeded", "failed", "cancelled", "expired"}

WINDOWS_APP = '''import os
import signal

import ember
from ember_runtime.replica.queue_worker import QueueWorker

app = ember.App("windows")

# The crashes are this app's own code, not a switch of the platform's: the replica runs the app, and the app wraps
# the replica's settling of a call. The first delivery of each call dies just before its final record is stored,
# the second just after (before its dead letter or event result); the third finds the record and repeats those.
settle, side_effects = QueueWorker._settle, QueueWorker._side_effects


def crash(point, msg, call_id, delivery):
    if msg.metadata.num_delivered == delivery:
        print(f"fault: crashing {point} {call_id}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


async def crashing_settle(self, msg, record, status, **kwargs):
    crash("before-record", msg, record.call_id, 1)
    await settle(self, msg, record, status, **kwargs)


async def crashing_side_effects(self, msg, done, **kwargs):
    crash("after-record", msg, done.call_id, 2)
    await side_effects(self, msg, done, **kwargs)


QueueWorker._settle, QueueWorker._side_effects = crashing_settle, crashing_side_effects

@app.function(retries=0)
def poison(tag: str) -> str:
    raise RuntimeError(f"poisoned {tag}")

@app.function(on="events.windows.in.>", result_subject="events.windows.out", retries=0)
def judge(event: dict) -> str:
    if event.get("poison"):
        raise ValueError("unreadable event")
    return event["tag"]
'''

DOOMED_APP = '''import time
import ember
app = ember.App("doomed")

@app.function()
def hold(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
'''




def letters_of(http: httpx.Client, app: str, function: str, **params: object) -> list[dict]:
    response = http.get(f"/v1/apps/{app}/dead", params={"function": function, **params})
    assert response.status_code == 200, response.text
    return response.json()


# -- a replica killed (SIGKILL) at each point of settling a call ------------------------------------------------


def test_a_replica_killed_around_the_final_record_loses_no_dead_letter_nor_event_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Every call here kills its replica once just before its final record is stored, and once just after (the
    app's own code does, see WINDOWS_APP); the redeliveries must still leave exactly one dead letter for each failed
    call and publish each event's result (at least once: a consumer deduplicates by Ember-Call-Id)."""
    monkeypatch.setenv("EMBER_ACK_WAIT_S", "3")
    (tmp_path / "app").mkdir()
    app_file = tmp_path / "app" / "windows.py"  # the bundle is the app's folder: not the platform's state
    app_file.write_text(WINDOWS_APP)
    with TestPlatform(tmp_path / "state") as platform, authed_client(platform) as http:
        transport = Transport(platform.url, token=platform.token)
        ember.deploy(app_file, transport=transport, timeout_s=120)
        transport.close()

        async def run() -> tuple[str, dict, dict[str, list]]:
            nc = await admin_connect(platform.nats_url)
            results: dict[str, list] = {}

            async def on_result(msg: nats.aio.msg.Msg) -> None:
                results.setdefault(msg.headers["Ember-Call-Id"], []).append(msg)

            await nc.subscribe("events.windows.out", cb=on_result)
            await natsflush.flush(nc)
            js = nc.jetstream()
            # One call at a time: a kill also ends whatever other call the replica holds, and that call's
            # redelivery (its second) would skip its own first window.
            spawned = await asyncio.to_thread(spawn, http, "poison", "p1", "windows")
            record = await asyncio.to_thread(result, http, spawned, 120)
            for count, (name, event) in enumerate((("good", {"tag": "fine"}), ("bad", {"poison": True})), start=1):
                await js.publish(f"events.windows.in.{name}", json.dumps(event).encode(),
                                 headers={"Nats-Msg-Id": name})
                give_up = time.monotonic() + 120
                while len(results) < count and time.monotonic() < give_up:
                    await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)
            await nc.close()
            return spawned, record, results

        spawned, record, results = asyncio.run(run())
        assert record["status"] == "failed"
        expected = {(point, call) for point in ("before-record", "after-record") for call in (spawned, *results)}
        wait_for(lambda: expected <= {tuple(line.split()[2:4]) for line in _crash_lines(http)}, timeout_s=30,
                 what=f"each call to have crashed its replica at both points: {sorted(expected)}",
                 explain=lambda: "crashes logged:\n" + "\n".join(_crash_lines(http)))
        by_status = {msgs[0].headers["Ember-Status"]: (call_id, msgs) for call_id, msgs in results.items()}
        assert set(by_status) == {"succeeded", "failed"}, results  # both events' results were published
        assert json.loads(by_status["succeeded"][1][0].data) == "fine"
        bad_id = by_status["failed"][0]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            letters = [d["call_id"] for fn in ("poison", "judge") for d in letters_of(http, "windows", fn)]
            if spawned in letters and bad_id in letters:
                break
            time.sleep(0.5)
        assert sorted(letters) == sorted([spawned, bad_id])  # each failed call's letter, once
        assert http.get(f"/v1/calls/{bad_id}").json()["status"] == "failed"


def _crash_lines(http: httpx.Client) -> list[str]:
    """The lines in which the windows app said it was crashing its replica."""
    response = http.get("/v1/apps/windows/logs", params={"limit": 5000})
    assert response.status_code == 200, response.text
    return [line["line"] for line in response.json() if line["line"].startswith("fault: crashing ")]


# -- deleting an app ----------------------------------------------------------------------------------------


def test_deleting_an_app_cancels_its_queued_calls(tmp_path, platform, http, transport):
    app_file = tmp_path / "doomed.py"
    app_file.write_text(DOOMED_APP)
    ember.deploy(app_file, transport=transport, timeout_s=120)
    ids = [spawn(http, "hold", 3.0, app="doomed") for _ in range(12)]
    time.sleep(0.5)
    assert http.delete("/v1/apps/doomed").status_code in (200, 204)
    records = [http.get(f"/v1/calls/{call_id}").json() for call_id in ids]
    unfinished = [r for r in records if r["status"] not in FINAL]
    assert not unfinished, unfinished  # none is left "queued" (or "running" on a replica that is gone)
    cancelled = [r for r in records if r["status"] == "cancelled"]
    assert len(cancelled) >= 8
    assert all("deleted" in r["error"]["message"] for r in cancelled)


# -- replay -------------------------------------------------------------------------------------------------


def test_replays_that_race_queue_a_dead_letter_once(probe, http):
    poison = f"poison-{uuid.uuid4().hex[:8]}"
    first = spawn(http, "flaky", poison)
    assert result(http, first)["status"] == "failed"
    deadline = time.monotonic() + 30
    while first not in {d["call_id"] for d in letters_of(http, "probe", "flaky")}:
        assert time.monotonic() < deadline, "no dead letter"
        time.sleep(0.2)
    start = threading.Barrier(4)
    answers: list[list[str]] = []

    def replay() -> None:
        with httpx.Client(base_url=http.base_url, timeout=60, headers=http.headers) as own:
            start.wait()
            response = own.post("/v1/apps/probe/dead/replay", json={"function": "flaky", "call_ids": [first]})
            assert response.status_code == 200, response.text
            answers.append(response.json()["replayed"])

    threads = [threading.Thread(target=replay) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    new_ids = {call_id for replayed in answers for call_id in replayed}
    assert len(new_ids) == 1, answers  # every replay that saw the letter queued the same one call
    (new_id,) = new_ids
    assert result(http, new_id)["status"] == "failed"
    letters = [d["call_id"] for d in letters_of(http, "probe", "flaky", limit=1000)]
    assert first not in letters
    deadline = time.monotonic() + 10
    while new_id not in letters and time.monotonic() < deadline:
        time.sleep(0.2)
        letters = [d["call_id"] for d in letters_of(http, "probe", "flaky", limit=1000)]
    assert letters.count(new_id) == 1


BOOM = """import ember
app = ember.App("{app}")


@app.function(retries=ember.Retries(max_retries=0), max_concurrency=8)
def boom(x: int) -> int:
    raise RuntimeError(f"boom {{x}}")
"""


def test_a_replay_resubmits_the_letters_there_when_it_came_and_ends(http, transport, tmp_path: Path):
    """Each replayed call fails again into a new letter: the replay takes those there when it came, and ends (it read
    on into its own new letters, and replayed a function that always fails without end, past any quota)."""
    app = f"boom-{uuid.uuid4().hex[:6]}"
    (tmp_path / "boom.py").write_text(BOOM.format(app=app))
    ember.deploy(tmp_path / "boom.py", transport=transport, timeout_s=120)
    try:
        ids = [spawn(http, "boom", n, app=app) for n in range(40)]
        assert {result(http, call_id)["status"] for call_id in ids} == {"failed"}
        wait_for(lambda: len(letters_of(http, app, "boom", limit=1000)) == 40, timeout_s=30, what="the 40 letters")
        replayed = http.post(f"/v1/apps/{app}/dead/replay", json={"function": "boom"}, timeout=120)
        assert replayed.status_code == 200, replayed.text
        assert len(replayed.json()["replayed"]) == 40
        named = http.post(f"/v1/apps/{app}/dead/replay", json={"function": "boom", "call_ids": ["x"] * 10_001})
        assert named.status_code == 422 and named.json()["error"]["field"] == "$.call_ids", named.text
    finally:
        http.delete(f"/v1/apps/{app}")


# -- reading dead letters -----------------------------------------------------------------------------------


def test_reading_dead_letters_creates_no_consumer_and_pages(probe, platform, http):
    ids = [spawn(http, "boom", f"page-{n}") for n in range(3)]
    for call_id in ids:
        assert result(http, call_id)["status"] == "failed"

    async def consumers() -> int:
        nc = await admin_connect(platform.nats_url)
        try:
            return (await nc.jetstream().stream_info(subjects.DEAD_STREAM)).state.consumer_count
        finally:
            await nc.close()

    before = asyncio.run(consumers())
    for _ in range(8):
        letters_of(http, "probe", "boom")
    assert asyncio.run(consumers()) == before

    everything = letters_of(http, "probe", "boom", limit=1000)
    assert set(ids) <= {d["call_id"] for d in everything}
    assert letters_of(http, "probe", "boom") == everything[:100]  # no parameters: the first page, as before
    seqs = [d["seq"] for d in everything]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and all(seqs)
    paged, after = [], 0
    while page := letters_of(http, "probe", "boom", limit=2, after=after):
        assert len(page) <= 2
        paged += page
        after = page[-1]["seq"]
    assert [d["call_id"] for d in paged] == [d["call_id"] for d in everything]
    for bad in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"after": -1}, {"after": "1.5"}):
        response = http.get("/v1/apps/probe/dead", params={"function": "boom", **bad})
        assert response.status_code == 400, (bad, response.text)
        assert response.json()["error"]["field"] == next(iter(bad))
