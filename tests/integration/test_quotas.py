"""Quotas against the real platform: a rate quota and a concurrency quota answer 429 with Retry-After while the
admitted calls answer correctly, a replicas quota holds a service below its min_replicas and says so in the status,
a token quota concerns that token only, and the routes are the admin's and validate their bodies."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from support.auth import authed_client, bearer
from support.polling import wait_for

from ember._bundle import build_bundle
from ember._client import Transport
from ember._deploy import deploy, inspect_app
from ember.dev.embedded import EmbeddedPlatform
from ember.wire import DeployRequest, NewToken, QuotaView, StatusView, encoder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FAST = '''import ember
app = ember.App("quota-fast")

@app.function(min_replicas=1)
def double(x: int) -> int:
    return 2 * x


@app.function(schedule=ember.Period(seconds=3600))
def hourly() -> None:
    pass
'''
SLOW = '''import threading
import ember
app = ember.App("quota-slow")
gate = threading.Event()

@app.function(min_replicas=1, batch=ember.Batch(max_size=8, window_ms=1), timeout_s=60)
def hold(xs: list[float]) -> list[float]:
    gate.wait(min(xs))
    return xs
'''
MANY = '''import ember
app = ember.App("quota-many")

@app.function(min_replicas=3, max_replicas=3)
def one() -> int:
    return 1
'''


def _write(tmp_path: Path, name: str, source: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    path = folder / f"{name.replace('-', '_')}.py"
    path.write_text(source)
    return path


def _put(http: httpx.Client, name: str, **body: Any) -> httpx.Response:
    return http.put(f"/v1/quotas/{name}", json=body)


def _quotas(http: httpx.Client) -> dict[str, QuotaView]:
    response = http.get("/v1/quotas")
    assert response.status_code == 200, response.text
    return {v.quota.name: v for v in msgspec.json.decode(response.content, type=list[QuotaView])}


def _token(http: httpx.Client, scopes: list[str]) -> NewToken:
    response = http.post("/v1/tokens", json={"scopes": scopes, "apps": ["*"]})
    assert response.status_code == 201, response.text
    return msgspec.json.decode(response.content, type=NewToken)


@pytest.fixture
def admin(platform: EmbeddedPlatform) -> Iterator[httpx.Client]:
    with authed_client(platform) as client:
        yield client
        for name in _quotas(client):
            if name.startswith("qt-"):
                client.delete(f"/v1/quotas/{name}")


def test_a_rate_quota_429s_part_of_a_burst_and_the_rest_answer(tmp_path: Path, transport: Transport,
                                                               admin: httpx.Client) -> None:
    deploy(_write(tmp_path, "quota-fast", FAST), transport=transport, timeout_s=120)
    try:
        # 3 calls at once, then one every 100 s: a burst of 10 gets 3 answers and 7 refusals
        assert _put(admin, "qt-rate", apps="quota-f*", rate_per_s=0.01, burst=3).status_code == 200
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda x: admin.post("/v1/quota-fast/double", json=x), range(10)))
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [200] * 3 + [429] * 7
        for x, r in enumerate(answers):
            if r.status_code == 200:
                assert r.json() == 2 * x
            else:
                assert r.json()["error"]["code"] == "rate_limited"
                assert r.headers["Retry-After"] == "100"  # seconds until the next token, rounded up
        spawned = admin.post("/v1/quota-fast/double/spawn", json=1)
        assert spawned.status_code == 429 and int(spawned.headers["Retry-After"]) >= 1
        run = admin.post("/v1/apps/quota-fast/schedules/hourly/run")  # a run asked for is a queued call too
        assert run.status_code == 429 and int(run.headers["Retry-After"]) >= 1, run.text

        # a token quota: calls made with that token only
        assert admin.delete("/v1/quotas/qt-rate").status_code == 200
        limited, free = _token(admin, ["invoke"]), _token(admin, ["invoke"])
        assert _put(admin, "qt-token", token=limited.info.id, max_concurrent_calls=0).status_code == 200
        refused = httpx.post(f"{admin.base_url}/v1/quota-fast/double", json=4, headers=bearer(limited.token))
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        answered = httpx.post(f"{admin.base_url}/v1/quota-fast/double", json=4, headers=bearer(free.token))
        assert answered.status_code == 200 and answered.json() == 8
        assert admin.post("/v1/quota-fast/double", json=5).json() == 10
    finally:
        admin.delete("/v1/apps/quota-fast")


def test_a_concurrency_quota_429s_the_call_over_it_while_those_in_flight_complete(
        tmp_path: Path, transport: Transport, admin: httpx.Client) -> None:
    deploy(_write(tmp_path, "quota-slow", SLOW), transport=transport, timeout_s=120)
    try:
        assert _put(admin, "qt-conc", apps="quota-slow", max_concurrent_calls=2).status_code == 200
        results: list[httpx.Response] = []

        def call(seconds: float) -> None:
            results.append(admin.post("/v1/quota-slow/hold", json=seconds))

        threads = [threading.Thread(target=call, args=(3.0,)) for _ in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: _quotas(admin)["qt-conc"].usage.calls_in_flight == 2, 30, "two calls in flight")
        over = admin.post("/v1/quota-slow/hold", json=0.0)
        assert over.status_code == 429 and over.headers["Retry-After"] == "1"
        assert over.json()["error"]["code"] == "rate_limited" and "qt-conc" in over.json()["error"]["message"]
        for t in threads:
            t.join(60)
        assert [(r.status_code, r.json()) for r in results] == [(200, 3.0), (200, 3.0)]
        assert _quotas(admin)["qt-conc"].usage.calls_in_flight == 0

        # a call that times out gives its slot back too
        late = admin.post("/v1/quota-slow/hold", json=5.0, headers={"X-Ember-Timeout": "0.5"})
        assert late.status_code == 504
        assert _quotas(admin)["qt-conc"].usage.calls_in_flight == 0
        assert admin.post("/v1/quota-slow/hold", json=0.0).json() == 0.0
    finally:
        admin.delete("/v1/apps/quota-slow")


def test_a_replicas_quota_below_min_replicas_is_shown_and_holds(tmp_path: Path, transport: Transport,
                                                                admin: httpx.Client, ember_cli: Any,
                                                                platform: EmbeddedPlatform) -> None:
    assert _put(admin, "qt-many", apps="quota-many", max_replicas=1).status_code == 200
    path = _write(tmp_path, "quota-many", MANY)
    bundle = build_bundle(path.parent)
    transport.request("PUT", f"/v1/bundles/{bundle.sha256}", content=bundle.data)
    transport.request("POST", "/v1/apps/quota-many/deployments", headers={"content-type": "application/json"},
                      content=encoder.encode(DeployRequest(bundle_sha256=bundle.sha256, manifest=inspect_app(path))))
    try:
        def service() -> Any:
            view = msgspec.json.decode(admin.get("/v1/status", params={"app": "quota-many"}).content,
                                       type=StatusView)
            return view.services[0], [r for n in view.nodes for r in n.replicas if r.app == "quota-many"]

        wait_for(lambda: service()[0].ready == 1, 90, "the one replica the quota allows")
        svc, replicas = service()
        assert (svc.min_replicas, svc.desired, len(replicas)) == (3, 1, 1)
        assert "qt-many" in svc.quota and "min_replicas 3" in svc.quota
        shown = ember_cli("status", "quota-many", url=platform.url).stdout
        assert "held back" in shown and "qt-many" in shown
        assert _quotas(admin)["qt-many"].usage.replicas == 1
        listed = ember_cli("quota", "ls", url=platform.url).stdout
        assert "qt-many" in listed and "1/1" in listed

        assert admin.delete("/v1/quotas/qt-many").status_code == 200
        wait_for(lambda: service()[0].ready == 3 and not service()[0].quota, 120, "three replicas once it is gone")
        # a lowered quota scales the running replicas down, as any scale-down
        assert _put(admin, "qt-many", apps="quota-*", max_replicas=2).status_code == 200
        wait_for(lambda: len(service()[1]) == 2, 60, "two replicas under the lowered quota")
        assert service()[0].desired == 2 and "max_replicas 2" in service()[0].quota
    finally:
        admin.delete("/v1/apps/quota-many")


def test_quota_routes_are_the_admins_and_check_their_bodies(admin: httpx.Client, ember_cli: Any,
                                                            platform: EmbeddedPlatform) -> None:
    for scopes in (["invoke"], ["deploy", "read"]):
        token = _token(admin, scopes).token
        for method, path in (("GET", "/v1/quotas"), ("PUT", "/v1/quotas/qt-x"), ("DELETE", "/v1/quotas/qt-x")):
            response = httpx.request(method, f"{admin.base_url}{path}", json={"apps": "*", "max_replicas": 1},
                                     headers=bearer(token))
            assert response.status_code == 403, (scopes, method, response.text)
    assert httpx.get(f"{admin.base_url}/v1/quotas").status_code == 401
    for body, field in (({"max_replicas": 1}, "$.apps"), ({"apps": "*", "max_replicas": -1}, "$.max_replicas"),
                        ({"apps": "*", "rate_per_s": "fast"}, "$.rate_per_s"), ({"apps": "*"}, "$"),
                        ({"apps": "*", "max_replicas": 1, "colour": "red"}, "$.colour"),
                        ({"token": "nosuchtoken", "rate_per_s": 1}, "$.token"),
                        ({"token": "abc", "max_replicas": 1}, "$.max_replicas")):
        response = _put(admin, "qt-bad", **body)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["field"] == field, body
    assert _put(admin, "Bad_Name", apps="*", max_replicas=1).status_code == 422
    assert admin.put("/v1/quotas/qt-bad", content=b"{nope").status_code == 400
    assert admin.delete("/v1/quotas/qt-none").status_code == 404
    assert "qt-bad" not in _quotas(admin)

    made = ember_cli("quota", "set", "qt-cli", "--apps", "team-a-*", "--gpu-memory", "80GB", "--rate", "600/m",
                     url=platform.url).stdout
    assert "qt-cli" in made and "81920 MB" in made and "10 calls/s" in made
    quota = _quotas(admin)["qt-cli"].quota
    assert (quota.apps, quota.max_gpu_memory_mb, quota.rate_per_s, quota.burst) == ("team-a-*", 81920, 10.0, 10)
    bad = ember_cli("quota", "set", "qt-cli", "--apps", "x", "--rate", "often", url=platform.url, check=False)
    assert bad.returncode == 1 and "--rate" in bad.stderr
    assert "removed quota qt-cli" in ember_cli("quota", "rm", "qt-cli", url=platform.url).stdout
    assert "qt-cli" not in _quotas(admin)
    assert admin.get("/openapi.json").json()["paths"]["/v1/quotas/{quota}"]["put"]["requestBody"]
