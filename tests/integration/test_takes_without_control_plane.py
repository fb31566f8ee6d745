"""A queued call pulled while no control plane answers its replica's reads (the only one restarting): the replica
takes it again, holding it in progress, until one answers, and it runs on that first delivery. Before, the replica
left it at the first refusal: it came back an ack wait later as a second attempt (three such in a row failed it
as a poison input, unrun)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from support.auth import authed_client
from support.platform import TestPlatform
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import app_view, deploy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

APP = '''import ember
app = ember.App("takes")

@app.function(min_replicas=1)
def work(x: int) -> int:
    return x + 1
'''


def test_a_call_pulled_while_no_control_plane_answers_runs_on_its_first_delivery(tmp_path: Path) -> None:
    source = tmp_path / "takes.py"
    source.write_text(APP)
    with TestPlatform(tmp_path / "state") as platform, authed_client(platform, timeout=30) as http:
        with contextlib.closing(Transport(platform.url, token=platform.token)) as transport:
            deploy(source, transport=transport, timeout_s=120)
            (replica,) = [r for s in app_view(transport, "takes").services for r in s.replicas if r.state == "ready"]
        os.kill(replica.pid, signal.SIGSTOP)  # it pulls nothing until the control plane is gone
        try:
            spawned = http.post("/v1/takes/work/spawn", json=41)
            assert spawned.status_code == 202, spawned.text
            platform.kill("platform")
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        time.sleep(3)  # it pulls the call; its reads of it find no control plane
        platform.start_platform()
        call_id = spawned.json()["call_id"]
        wait_for(lambda: http.get(f"/v1/calls/{call_id}").json().get("status") == "succeeded", timeout_s=90,
                 what="the call to run")
        record = http.get(f"/v1/calls/{call_id}").json()
        assert record["output"] == 42 and record["attempts"] == 1, record
