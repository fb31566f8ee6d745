"""``ember rollback`` and ``ember promote`` wait as ``ember push`` does: they show progress and return once the
version takes every call, so that a call made right after is answered by it; ``--no-wait`` returns at once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import httpx
import pytest
from support.platform import TestPlatform
from support.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

APP = "rollback-waits"
FN = "M.which"
SOURCE = '''import time
import ember

app = ember.App("{app}")
LABEL = "{label}"


@app.model(min_replicas=1, max_replicas=1)
class M:
    @ember.setup
    def load(self) -> None:
        time.sleep(1.0)  # a setup that takes a while: a rollback that did not wait would be answered by the other

    @ember.method()
    def which(self, x: int) -> dict:
        return {{"label": LABEL, "x": x}}
'''

Cli = Callable[..., CompletedProcess[str]]


def _push(cli: Cli, url: str, path: Path, label: str, *extra: str) -> None:
    path.write_text(SOURCE.format(app=APP, label=label))
    cli("push", str(path), *extra, url=url)


def _label(http: httpx.Client) -> str:
    answer = http.post(f"/v1/{APP}/{FN}", json=1)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["label"])


def _traffic(http: httpx.Client) -> dict[int, int]:
    view = http.get(f"/v1/apps/{APP}").json()
    return {v["version"]: v["percent"] for v in view["versions"] if v["percent"]}


def _running(http: httpx.Client) -> set[int]:
    return {r["version"] for s in http.get(f"/v1/apps/{APP}").json()["services"] for r in s["replicas"]}


def test_rollback_and_promote_return_once_the_version_serves(platform: TestPlatform, http: httpx.Client,
                                                              ember_cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "app.py"
    _push(ember_cli, platform.url, path, "one")
    _push(ember_cli, platform.url, path, "two")
    try:
        wait_for(lambda: _running(http) == {2}, timeout_s=120, what="v1 to drain and stop")

        rolled = ember_cli("rollback", APP, url=platform.url)
        assert f"{APP}: rolled back to v1 (v1 100%" in rolled.stdout, rolled.stdout
        assert "rolling back to rollback-waits v1" in rolled.stderr and "ready" in rolled.stderr, rolled.stderr
        assert _label(http) == "one"  # the first call after it returned

        wait_for(lambda: _running(http) == {1}, timeout_s=120, what="v2 to drain and stop")
        queued = ember_cli("rollback", APP, "--to", "2", "--no-wait", url=platform.url)
        assert f"{APP}: rolling back to v2 (v1 100%, v2 rolling-out)" in queued.stdout, queued.stdout
        wait_for(lambda: _traffic(http) == {2: 100}, timeout_s=120, what="the rollback to v2")

        _push(ember_cli, platform.url, path, "three", "--canary", "50")
        promoted = ember_cli("promote", APP, url=platform.url)
        assert f"{APP}: promoted v3 (" in promoted.stdout and "v3 100%" in promoted.stdout, promoted.stdout
        assert _traffic(http) == {3: 100}
        assert {_label(http) for _ in range(10)} == {"three"}
    finally:
        ember_cli("delete", APP, url=platform.url)
