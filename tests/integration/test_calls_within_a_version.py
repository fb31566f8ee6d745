"""A function's call to a function of its own app reaches its own version while that runs: during a canary (or a
rollout, or a call pinned to a version), the new version's code calls what the new version has. Before, the app's
traffic split drew the version, and the canary's calls went to the stable version: to a function it lacks, or with
the old code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ember._client import Transport
from ember._deploy import deploy
from ember._errors import EmberError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
APP = "own-version"
SOURCE = '''import ember

app = ember.App({app!r})


@app.function()
def outer() -> str:
    return ember.lookup({app!r}, "inner").remote()


@app.function()
def inner() -> str:
    return {label!r}
'''


@pytest.fixture
def source(tmp_path: Path, transport: Transport) -> Iterator[Path]:
    yield tmp_path / "own_version.py"
    with contextlib.suppress(EmberError):
        transport.request("DELETE", f"/v1/apps/{APP}")


def test_a_canarys_call_of_its_own_app_reaches_the_canary(source: Path, transport: Transport, http: httpx.Client):
    source.write_text(SOURCE.format(app=APP, label="v1"))
    deploy(source, transport=transport, timeout_s=120)
    source.write_text(SOURCE.format(app=APP, label="v2"))
    deploy(source, transport=transport, timeout_s=120, canary_percent=1)  # the stable v1 takes 99 % of the calls
    for version, label in ((2, "v2"), (1, "v1")):
        for _ in range(8):
            answer = http.post(f"/v1/{APP}@{version}/outer", json={})
            assert answer.status_code == 200 and answer.json() == label, (version, answer.text)
