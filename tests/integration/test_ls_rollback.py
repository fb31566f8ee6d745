"""``ember ls`` through a rollback of a class model: one row per function, whichever versions are on their way in
or out (the view lists the app's services once, from the version it serves or rolls out)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from support.platform import TestPlatform
from support.polling import wait_for

pytestmark = pytest.mark.integration

APP = "ls-rollback"
SOURCE = '''import ember

app = ember.App("{app}")
LABEL = "{label}"


@app.model(min_replicas=1, max_replicas=2)
class M:
    @ember.method()
    def which(self, x: int) -> dict:
        return {{"label": LABEL, "x": x}}

    @ember.method()
    def twice(self, x: int) -> int:
        return 2 * x
'''


def listed(ember_cli: Callable[..., CompletedProcess[str]], url: str) -> list[list[str]]:
    """``ember ls``'s rows for this test's app, split into columns."""
    lines = ember_cli("ls", url=url).stdout.splitlines()
    return [line.split(None, 2) for line in lines[2:] if line.startswith(f"{APP}.")]


def test_ls_shows_each_method_once_through_a_rollback(platform: TestPlatform, tmp_path: Path,
                                                       ember_cli: Callable[..., CompletedProcess[str]]) -> None:
    app = tmp_path / APP.replace("-", "_") / "app.py"
    app.parent.mkdir()
    for label in ("one", "two"):
        app.write_text(SOURCE.format(app=APP, label=label))
        ember_cli("push", str(app), url=platform.url)
    try:
        assert f"{APP}: rolled back to v1" in ember_cli("rollback", APP, url=platform.url).stdout
        rows = listed(ember_cli, platform.url)  # v1 on its way back, v2 still there
        assert sorted(row[0] for row in rows) == [f"{APP}.M.twice", f"{APP}.M.which"], rows
        assert all(row[1] == "v1" for row in rows), rows
        rows = wait_for(lambda: (found := listed(ember_cli, platform.url)) and "v2" not in found[0][2] and found,
                        120, "v2 to drain and stop")
        assert sorted(row[0] for row in rows) == [f"{APP}.M.twice", f"{APP}.M.which"], rows
        answer = json.loads(ember_cli("call", f"{APP}.M.which", "--data", "1", url=platform.url).stdout)
        assert answer == {"label": "one", "x": 1}
    finally:
        ember_cli("delete", APP, url=platform.url)
