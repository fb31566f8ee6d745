"""A control plane without tokens (``--insecure-no-auth``, loopback only) serves only requests that name a loopback
``Host`` and come from no other site's page: a page the developer visits could otherwise POST to the port (a form
needs no preflight) or, once its own name resolves to 127.0.0.1 (DNS rebinding), read the answers and deploy code."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from support.platform import TestPlatform

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def open_url(platform: TestPlatform) -> Iterator[str]:
    url = platform.add_control_plane("no-auth", flags=("--insecure-no-auth",))
    yield url
    platform.kill("no-auth")


def test_a_request_to_a_loopback_host_from_no_other_site_is_served(open_url: str) -> None:
    port = httpx.URL(open_url).port
    with httpx.Client(base_url=open_url, timeout=30) as client:
        assert client.get("/v1/apps").status_code == 200  # no token needed: that is the flag
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "127.0.0.1"):
            assert client.get("/v1/apps", headers={"Host": host}).status_code == 200, host
        same = client.post("/v1/tokens", json={"scopes": ["read"], "apps": ["*"]},
                           headers={"Origin": f"http://127.0.0.1:{port}"})
        assert same.status_code == 201, same.text  # the console's own requests
        assert client.delete(f"/v1/tokens/{same.json()['info']['id']}").status_code in (200, 204)


@pytest.mark.parametrize("headers", [
    {"Host": "evil.example"},  # DNS rebinding: the page's own name, resolved to 127.0.0.1
    {"Host": "evil.example:80", "Origin": "http://evil.example"},
    {"Origin": "http://evil.example"},  # a cross-site form's POST
    {"Origin": "null"},  # a sandboxed frame or a file's page
])
def test_a_request_from_another_site_or_to_another_name_is_refused(open_url: str, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=open_url, timeout=30) as client:
        made = client.post("/v1/tokens", content=b'{"scopes": ["admin"], "apps": ["*"]}',
                           headers={"Content-Type": "text/plain", **headers})
        assert made.status_code == 403, made.text  # 201 before: an admin token for the page
        assert "--insecure-no-auth" in made.json()["error"]["message"]
        assert client.get("/v1/apps", headers=headers).status_code == 403
        assert client.get("/healthz", headers=headers).status_code == 200  # the probes stay open
