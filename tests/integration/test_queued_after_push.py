"""Once a push's version takes the traffic, the calls queued after it run on that version: the version it replaced
is told at once to pull nothing from the function's queue (as a warm version is), though its replicas stay for their
drain. Before, they went on taking queued calls for their drain grace (2 s) and ran them with the code replaced."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import ember
from ember._client import Transport
from ember._deploy import deploy
from ember._errors import EmberError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
APP = "queued-after-push"
SOURCE = '''import ember

app = ember.App("queued-after-push")


@app.function(min_replicas=1, max_replicas=1)
def which(x: int) -> str:
    return "{label}"
'''


@pytest.fixture
def source(tmp_path: Path, transport: Transport, ember_url: str) -> Iterator[Path]:
    yield tmp_path / "queued_after_push.py"
    with contextlib.suppress(EmberError):
        transport.request("DELETE", f"/v1/apps/{APP}")


def test_calls_queued_after_a_push_run_on_the_version_it_rolled_out(source: Path, transport: Transport) -> None:
    source.write_text(SOURCE.format(label="v1"))
    deploy(source, transport=transport, timeout_s=120)
    fn = ember.lookup(APP, "which")
    assert fn.spawn(0).get(timeout=60) == "v1"  # the first version's replica pulls the queue
    source.write_text(SOURCE.format(label="v2"))
    deploy(source, transport=transport, timeout_s=120)  # returns once v2 takes the traffic
    calls = [fn.spawn(n) for n in range(16)]
    assert [call.get(timeout=60) for call in calls] == ["v2"] * 16
