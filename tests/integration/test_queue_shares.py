"""One app's spawns cannot fill the calls' queue that every app's spawns share: past its share
(``EMBER_CALLS_STREAM_MAX_BYTES_PER_APP``, 1 MiB here) a tenant's spawns get a 429 with Retry-After, while another
tenant's app spawns as before; once the first app's calls ran, it spawns again. Before, a tenant's ~256 spawns of
4 MiB that never ended filled the whole 1 GiB queue and every app's spawns got a 503. Through the product's doors:
two tenants' tokens, a push by each, ``POST /v1/<app>/<fn>/spawn``, ``GET /v1/calls/<id>?wait=``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.auth import bearer
from support.platform import TestPlatform
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
SHARE = 1 << 20
BLOB = "x" * (300 << 10)  # 300 KiB: three fit in the share, a fourth does not

APP = '''
import time

import ember

app = ember.App("{app}")


@app.function(min_replicas=1, max_concurrency=8, timeout_s=60)
def hold(blob: str, sleep_s: float) -> int:
    time.sleep(sleep_s)
    return len(blob)
'''


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestPlatform]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EMBER_CALLS_STREAM_MAX_BYTES_PER_APP", str(SHARE))
        with TestPlatform(tmp_path_factory.mktemp("shares")) as running:
            yield running


def _tenant(platform: TestPlatform, tmp_path: Path, prefix: str) -> tuple[httpx.Client, str]:
    """A token for ``<prefix>-*`` only, and an app of that name pushed with it."""
    made = httpx.post(f"{platform.url}/v1/tokens", headers=bearer(platform.token), timeout=30,
                      json={"scopes": ["deploy", "invoke", "read"], "apps": [f"{prefix}-*"], "name": prefix})
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    app = f"{prefix}-{uuid.uuid4().hex[:6]}"
    source = tmp_path / f"{prefix}.py"
    source.write_text(APP.format(app=app))
    transport = Transport(platform.url, token=token)
    try:
        deploy(source, transport=transport, timeout_s=180)
    finally:
        transport.close()
    return httpx.Client(base_url=platform.url, headers=bearer(token), timeout=90), app


def test_an_apps_spawns_past_its_share_are_refused_and_another_apps_go_on(platform: TestPlatform,
                                                                          tmp_path: Path) -> None:
    hog, hog_app = _tenant(platform, tmp_path, "hog")
    meek, meek_app = _tenant(platform, tmp_path, "meek")
    with hog, meek:
        held = [hog.post(f"/v1/{hog_app}/hold/spawn", json={"blob": BLOB, "sleep_s": 4}) for _ in range(3)]
        assert [r.status_code for r in held] == [202, 202, 202], [r.text for r in held]
        refused = hog.post(f"/v1/{hog_app}/hold/spawn", json={"blob": BLOB, "sleep_s": 0})
        assert refused.status_code == 429, refused.text
        assert refused.headers.get("retry-after")
        assert "EMBER_CALLS_STREAM_MAX_BYTES_PER_APP" in refused.json()["error"]["message"]

        other = meek.post(f"/v1/{meek_app}/hold/spawn", json={"blob": BLOB, "sleep_s": 0})  # its own share
        assert other.status_code == 202, other.text

        for client, call in [(hog, c) for c in held] + [(meek, other)]:  # nothing accepted was lost
            record = client.get(f"/v1/calls/{call.json()['call_id']}", params={"wait": 60})
            assert record.status_code == 200 and record.json()["status"] == "succeeded", record.text
        # its calls ran: its share is free again once their messages are acked (a moment after their records)
        wait_for(lambda: hog.post(f"/v1/{hog_app}/hold/spawn", json={"blob": BLOB, "sleep_s": 0}).status_code == 202,
                 timeout_s=30, what="the hog's spawn accepted again")
