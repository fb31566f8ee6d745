"""The kept output goes with the app: once it is deleted, the same name deployed again (by anyone whose token's
pattern matches it) shows none of the old app's lines in ``GET /v1/apps/<app>/logs``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

APP = "logs-forgotten"
SOURCE = '''import ember
app = ember.App("{app}")


@app.function(min_replicas=1, max_replicas=1)
def say(x: int) -> int:
    print("{label} said", x, flush=True)
    return x
'''


def push(folder: Path, label: str, transport: Transport) -> None:
    path = folder / "logs_forgotten.py"
    path.write_text(SOURCE.format(app=APP, label=label))
    deploy(path, transport=transport, timeout_s=120)


def kept(http: httpx.Client) -> list[str]:
    response = http.get(f"/v1/apps/{APP}/logs")
    assert response.status_code == 200, response.text
    return [line["line"] for line in response.json()]


def test_a_deleted_apps_output_is_not_shown_under_its_name_deployed_again(transport: Transport, http: httpx.Client,
                                                                          tmp_path: Path) -> None:
    try:
        push(tmp_path, "first", transport)
        assert http.post(f"/v1/{APP}/say", json=1).json() == 1
        wait_for(lambda: any("first said 1" in line for line in kept(http)), timeout_s=30, what="the first's line")
        assert http.delete(f"/v1/apps/{APP}").status_code == 204

        push(tmp_path, "second", transport)
        assert http.post(f"/v1/{APP}/say", json=2).json() == 2
        wait_for(lambda: any("second said 2" in line for line in kept(http)), timeout_s=30, what="the second's line")
        assert not [line for line in kept(http) if "first said" in line]
    finally:
        http.delete(f"/v1/apps/{APP}")
