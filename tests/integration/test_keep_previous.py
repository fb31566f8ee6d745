"""The version a push replaced stays warm for ``EMBER_KEEP_PREVIOUS_S``: a few of its replicas stay, taking no
call (not even queued ones), and ``ember rollback`` within that window switches to them at once, without starting
a replica; after the window they are released, and a rollback starts the version again. Each test runs a platform
of its own, with its own window."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.auth import authed_client
from support.platform import TestPlatform
from support.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

APP = "warm"
FN = "M.which"
SOURCE = '''import time
import ember

app = ember.App("{app}")
LABEL = "{label}"


@app.model(min_replicas=1, max_replicas=1)
class M:
    @ember.setup
    def load(self) -> None:
        time.sleep(1.0)

    @ember.method()
    def which(self, x: int) -> dict:
        return {{"label": LABEL, "x": x}}
'''


@pytest.fixture
def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Starts a platform whose replaced versions stay warm ``keep_s`` seconds; stopped after the test."""
    started: list[TestPlatform] = []

    def run(keep_s: float) -> TestPlatform:
        monkeypatch.setenv("EMBER_KEEP_PREVIOUS_S", str(keep_s))
        platform = TestPlatform(tmp_path / "state").__enter__()
        started.append(platform)
        return platform

    yield run
    for platform in started:
        platform.__exit__(None, None, None)


def cli(platform: TestPlatform, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "EMBER_URL": platform.url, "EMBER_TOKEN": platform.token})
    assert proc.returncode == 0, proc.stderr
    return proc


def push(platform: TestPlatform, folder: Path, label: str) -> None:
    path = folder / "app.py"
    path.write_text(SOURCE.format(app=APP, label=label))
    cli(platform, "push", str(path))


def versions(http: httpx.Client) -> dict[int, dict]:
    return {v["version"]: v for v in http.get(f"/v1/apps/{APP}").json()["versions"]}


def replicas(http: httpx.Client, version: int) -> set[str]:
    return {r["replica_id"] for s in http.get(f"/v1/apps/{APP}").json()["services"] for r in s["replicas"]
            if r["version"] == version}


def label(http: httpx.Client) -> str:
    answer = http.post(f"/v1/{APP}/{FN}", json=1)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["label"])


def test_a_rollback_within_the_window_switches_to_the_warm_replicas(start, tmp_path: Path) -> None:
    platform = start(600)
    with authed_client(platform) as http:
        push(platform, tmp_path, "one")
        push(platform, tmp_path, "two")
        wait_for(lambda: versions(http)[1]["warm"] and versions(http)[1]["ready"] == 1, timeout_s=60,
                 what="v1 to stay warm")
        warm = replicas(http, 1)
        assert len(warm) == 1 and "v1 warm" in cli(platform, "ls").stdout

        # Warm replicas take no call: queued ones too go to the version that serves.
        queued = [http.post(f"/v1/{APP}/{FN}/spawn", json=i).json()["call_id"] for i in range(8)]
        for call_id in queued:
            record = http.get(f"/v1/calls/{call_id}", params={"wait": 60}).json()
            assert record["status"] == "succeeded" and record["output"]["label"] == "two", record

        rolled = cli(platform, "rollback", APP)
        assert f"{APP}: rolled back to v1 (v1 100%" in rolled.stdout, rolled.stdout
        assert label(http) == "one"
        assert replicas(http, 1) == warm  # served by the replica kept warm: none started

        # v2 is the warm one now, and a rollback to it is as quick.
        wait_for(lambda: versions(http)[2]["warm"] and versions(http)[2]["ready"] == 1, timeout_s=60,
                 what="v2 to stay warm")
        kept = replicas(http, 2)
        cli(platform, "rollback", APP, "--to", "2")
        assert label(http) == "two" and replicas(http, 2) == kept


def test_after_the_window_the_replaced_version_is_released(start, tmp_path: Path) -> None:
    platform = start(5)
    with authed_client(platform) as http:
        push(platform, tmp_path, "one")
        push(platform, tmp_path, "two")
        before = replicas(http, 1)
        wait_for(lambda: not replicas(http, 1), timeout_s=60, what="v1 to be released")
        assert not versions(http)[1]["warm"] and versions(http)[1]["state"] == "kept"

        rolled = cli(platform, "rollback", APP)  # starts v1 again, and waits for it
        assert f"{APP}: rolled back to v1 (v1 100%" in rolled.stdout, rolled.stdout
        assert label(http) == "one"
        assert replicas(http, 1).isdisjoint(before)
