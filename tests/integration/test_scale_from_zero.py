"""Queued work wakes a function scaled to zero: an event backlog counts as pending calls, like spawned ones."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.natsconn import connect as admin_connect
from support.polling import wait_for

from ember._deploy import deploy
from ember.wire import subjects
from ember_runtime.replica.event_headers import event_scope

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

APP = '''import ember
app = ember.App("sleepy")

@app.function(on="events.sleepy.in.>", min_replicas=0, max_replicas=1)
def wake(x: int) -> int:
    return x + 1
'''


def test_an_event_wakes_a_function_scaled_to_zero(platform, transport, http, tmp_path: Path):
    (tmp_path / "sleepy.py").write_text(APP)
    deploy(tmp_path / "sleepy.py", transport=transport, timeout_s=60)
    try:
        assert http.get("/v1/apps/sleepy").json()["services"][0]["replicas"] == []  # nothing runs yet

        async def publish() -> None:
            nc = await admin_connect(platform.nats_url)
            try:
                await nc.jetstream().publish("events.sleepy.in.one", b"41", headers={"Nats-Msg-Id": "wake-1"})
            finally:
                await nc.close()

        asyncio.run(publish())
        call_id = f"ev-{event_scope(subjects.events_stream('sleepy', 'wake'))}-wake-1"

        def done() -> dict | None:
            response = http.get(f"/v1/calls/{call_id}")
            record = response.json() if response.status_code == 200 else {}
            return record if record.get("status") == "succeeded" else None

        record = wait_for(done, timeout_s=90, what="the event to wake a replica and run")
        assert record["output"] == 42
    finally:
        http.delete("/v1/apps/sleepy")
