"""A node agent fetches each replica's bundle on its own: a fetch that takes long holds up no other replica, not
even one assigned while it runs. A start that fails before any process runs is said and tried again."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.faults import AgentFaults
from support.platform import TestPlatform
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy

pytestmark = pytest.mark.integration

APP = "import ember\napp = ember.App({name!r})\n\n\n@app.function()\ndef ping(x: int) -> int:\n    return x + {n}\n"


def _app(folder: Path, name: str, n: int) -> Path:
    folder.mkdir()
    (folder / f"{name}.py").write_text(APP.format(name=name, n=n))
    return folder / f"{name}.py"


def test_a_slow_bundle_fetch_holds_up_no_other_replica(tmp_path: Path):
    slow, fast = _app(tmp_path / "slow", "slowfetch", 1), _app(tmp_path / "fast", "quickfetch", 2)
    hang = AgentFaults(hold_fetch={"slowfetch": 600})  # the node's fetch of this app's bundle hangs
    with TestPlatform(tmp_path / "state", faults=hang) as ember:
        transport = Transport(ember.url, token=ember.token)
        try:
            deploy(slow, transport=transport, wait=False)
            log = ember.log_dir / "agent.log"
            wait_for(lambda: "holding the fetch of slowfetch" in log.read_text(), timeout_s=60,
                     what="the agent to begin the slow fetch")
            # Assigned while the other fetch hangs: it starts and serves (the old agent waited for every fetch).
            deploy(fast, transport=transport, timeout_s=90)
            assert transport.json("POST", "/v1/quickfetch/ping", json=40) == 42
            assert "starting slowfetch" not in log.read_text()  # still fetching
            assert transport.request("DELETE", "/v1/apps/slowfetch").status_code == 204
        finally:
            transport.close()


def test_a_start_that_fails_before_its_process_runs_is_said_and_tried_again(tmp_path: Path):
    """Before, the replica's supervisor died with the start's exception: the replica stayed 'starting' for good,
    with nothing in the agent's log (CI's replicas never ready: a sandbox that could not be set up)."""
    app = _app(tmp_path / "retried", "retried", 3)
    with TestPlatform(tmp_path / "state", faults=AgentFaults(failed_starts={"retried": 2})) as ember:
        transport = Transport(ember.url, token=ember.token)
        try:
            deploy(app, transport=transport, timeout_s=90)
            assert transport.json("POST", "/v1/retried/ping", json=39) == 42
            log = (ember.log_dir / "agent.log").read_text().splitlines()
            said = [line for line in log if "could not start" in line]
            assert len(said) == 2 and all("OSError: fault: a start of retried's replica failed" in s for s in said)
        finally:
            transport.close()
