"""A function's event stream captures the subjects of the version that serves: a push that binds it elsewhere moves
the stream there, and ``ember rollback`` moves it back, so that an event on the subject the serving version binds (and
the one an events token may publish on) is stored and runs after a rollback, as it did before the push."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy, rollback
from ember._errors import ConflictError, EmberError
from ember.wire import subjects
from ember_runtime.replica.event_headers import event_scope

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
APP = "rebind"
SOURCE = '''import ember

app = ember.App("rebind")


@app.function(on="events.rebind.{where}")
def seen(event: dict) -> str:
    return "{label}:" + event["tag"]
'''


@pytest.fixture
def pushed(tmp_path: Path, transport: Transport) -> Iterator[Path]:
    yield tmp_path / "rebind.py"
    with contextlib.suppress(EmberError):
        transport.request("DELETE", f"/v1/apps/{APP}")


def _push(path: Path, transport: Transport, where: str, label: str) -> None:
    path.write_text(SOURCE.format(where=where, label=label))
    deploy(path, transport=transport, timeout_s=120)


def _ran(http: httpx.Client, subject: str, key: str) -> dict:
    """Publish an event on ``subject`` over HTTP under ``key``; the record of its call once final."""
    answer = http.post(f"/v1/events/{subject}", json={"tag": key}, headers={"Idempotency-Key": key})
    assert answer.status_code == 202, (subject, answer.status_code, answer.text)
    call_id = f"ev-{event_scope(subjects.events_stream(APP, 'seen'))}-{key}"
    # an event's call has a record once a replica takes it: until then, 404
    wait_for(lambda: http.get(f"/v1/calls/{call_id}").status_code == 200, timeout_s=60, what=f"{key} taken")
    return http.get(f"/v1/calls/{call_id}", params={"wait": 30}, timeout=60).json()


def test_a_rollback_binds_the_stream_to_the_subjects_of_the_version_it_brings_back(pushed, transport, http):
    _push(pushed, transport, "first", "v1")
    assert _ran(http, "events.rebind.first", "a1")["output"] == "v1:a1"
    _push(pushed, transport, "second", "v2")
    assert _ran(http, "events.rebind.second", "b1")["output"] == "v2:b1"  # (the version replaced pulls no more)
    assert http.post("/v1/events/events.rebind.first", json={"tag": "x"}).status_code == 404  # v2 binds it no more

    rollback(APP, to=1, transport=transport, timeout_s=120)
    record = _ran(http, "events.rebind.first", "a2")  # 503 before: the stream still took events.rebind.second only
    assert record["status"] == "succeeded" and record["output"] == "v1:a2", record
    assert http.post("/v1/events/events.rebind.second", json={"tag": "y"}).status_code == 404


def test_a_push_refused_binds_nothing(pushed, transport, http):
    """A second canary is refused (409); before, the push had already bound the function's stream to its subjects,
    and the events of the subject the running versions listen on were refused from then on."""
    _push(pushed, transport, "first", "v1")
    pushed.write_text(SOURCE.format(where="second", label="v2"))
    deploy(pushed, transport=transport, timeout_s=120, canary_percent=50)
    pushed.write_text(SOURCE.format(where="third", label="v3"))
    with pytest.raises(ConflictError, match="already has a canary"):
        deploy(pushed, transport=transport, timeout_s=120, canary_percent=50)
    assert http.post("/v1/events/events.rebind.third", json={"tag": "z"}).status_code == 404
    assert _ran(http, "events.rebind.second", "c1")["status"] == "succeeded"
