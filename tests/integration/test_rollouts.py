"""Rollouts over real HTTP and NATS: a loop of calls runs through a push of v2, a 20% canary of v3, its promotion
and two rollbacks, and sees no error and no call that waited for a cold start; pinned calls reach their version;
rollback, promote and pinning refuse what they must."""

from __future__ import annotations

import re
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import pytest
from support.auth import bearer
from support.platform import TestPlatform
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy
from ember.dev.embedded import EmbeddedPlatform

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

APP = "rolling"
FN = "M.which"
SETUP_S = 2.0  # every replica's setup: a call that waited for a cold start would have waited this long
PACE_S = 0.005  # the call loop's pace (``Calls``)
SOURCE = '''import time
import ember

app = ember.App("{app}")
VERSION = "{version}"


@app.model(min_replicas={min_replicas}, max_replicas=2, timeout_s=30)
class M:
    @ember.setup
    def load(self) -> None:
        time.sleep({setup_s})
        self.ready_at = time.time()

    @ember.method()
    def which(self, x: int) -> dict:
        return {{"version": VERSION, "x": x, "ready_at": self.ready_at}}
'''


def write_app(folder: Path, label: str, app: str = APP, min_replicas: int = 1) -> Path:
    path = folder / f"{app}.py"
    path.write_text(SOURCE.format(app=app, version=label, setup_s=SETUP_S, min_replicas=min_replicas))
    return path


@dataclass
class Calls:
    """A loop of synchronous calls in a thread, each recorded: when it started, how long it took, its status,
    the version that answered, whether it was sent before the replica that answered had finished its setup (it
    waited for a cold start), and when that setup ended. At most one call every ``PACE_S``: a call every few
    milliseconds through each change of version, not as many as two shared cores allow (which starved the tests
    beside it)."""

    url: str
    token: str
    app: str = APP
    seen: list[tuple[float, float, int, str, bool, float]] = field(default_factory=list)
    spawned: list[str] = field(default_factory=list)  # every tenth call is also queued: they must all succeed
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, headers=bearer(self.token), timeout=60) as client:
            i = 0
            while not self.stop.is_set():
                started, sent_at, cold, ready_at = time.monotonic(), time.time(), False, 0.0
                try:
                    response = client.post(f"/v1/{self.app}/{FN}", json=i)
                    status = response.status_code
                    label = response.json().get("version", "") if status == 200 else response.text[:200]
                    ready_at = response.json()["ready_at"] if status == 200 else 0.0
                    cold = ready_at > sent_at
                except httpx.HTTPError as exc:
                    status, label = 0, repr(exc)
                self.seen.append((started, time.monotonic() - started, status, label, cold, ready_at))
                self.stop.wait(max(0.0, started + PACE_S - time.monotonic()))
                if i % 10 == 0:
                    queued = client.post(f"/v1/{self.app}/{FN}/spawn", json=i)
                    self.spawned.append(queued.json()["call_id"] if queued.status_code == 202 else queued.text)
                i += 1

    def since(self, t: float) -> list[tuple[float, float, int, str, bool, float]]:
        return [c for c in list(self.seen) if c[0] >= t]


def _p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98]


def _view(http: httpx.Client, app: str = APP) -> dict:
    response = http.get(f"/v1/apps/{app}")
    assert response.status_code == 200, response.text
    return response.json()


def _traffic(http: httpx.Client) -> dict[int, int]:
    return {v["version"]: v["percent"] for v in _view(http)["versions"] if v["percent"]}


def _running(http: httpx.Client, app: str = APP) -> set[int]:
    return {r["version"] for s in _view(http, app)["services"] for r in s["replicas"]}


def test_calls_flow_through_push_canary_promote_and_rollback(platform: EmbeddedPlatform, transport: Transport,
                                                            http: httpx.Client, ember_cli, tmp_path: Path) -> None:
    source = write_app(tmp_path, "one")
    deploy(source, transport=transport, timeout_s=120)
    calls = Calls(platform.url, platform.token)
    calls.thread.start()
    try:
        wait_for(lambda: len(calls.seen) >= 200, timeout_s=60, what="steady calls")
        steady = [c for c in calls.seen[20:] if c[2] == 200]
        baseline = _p99([c[1] for c in steady])
        assert {c[3] for c in steady} == {"one"}

        # A push: v1 serves until v2 is ready, then v2 takes every call and v1 drains and stops.
        started = time.monotonic()
        write_app(tmp_path, "two")
        deploy(source, transport=transport, timeout_s=120)
        assert _traffic(http) == {2: 100}
        wait_for(lambda: _running(http) == {2}, timeout_s=60, what="v1 to drain and stop")
        time.sleep(0.5)
        after_push = calls.since(started)
        assert after_push[-1][3] == "two"

        # A canary at 20%: once ready it takes a fifth of the calls, and pinned calls reach either version.
        write_app(tmp_path, "three")
        deploy(source, transport=transport, timeout_s=120, canary_percent=20)
        assert _traffic(http) == {2: 80, 3: 20}
        status = ember_cli("status", APP, url=platform.url).stdout
        assert "v3 (v2 80%, v3 20%)" in status, status
        assert "v2 80%, v3 20% (canary)" in ember_cli("ls", url=platform.url).stdout
        canary_from = time.monotonic()
        wait_for(lambda: len(calls.since(canary_from)) >= 400, timeout_s=120, what="calls during the canary")
        shares = Counter(c[3] for c in calls.since(canary_from))
        assert set(shares) == {"two", "three"}, shares
        assert 0.12 <= shares["three"] / sum(shares.values()) <= 0.28, shares
        metrics = http.get("/metrics").text  # the calls each version answered, counted apart
        for version in (2, 3):
            assert re.search(rf'ember_requests_total{{[^}}]*app="{APP}"[^}}]*version="{version}"', metrics), version
        for version, label in ((2, "two"), (3, "three")):
            for i in range(5):
                pinned = http.post(f"/v1/{APP}@{version}/{FN}", json=i)
                assert pinned.status_code == 200 and pinned.json()["version"] == label
                assert pinned.headers["x-ember-version"] == str(version)
            queued = [http.post(f"/v1/{APP}@{version}/{FN}/spawn", json=i).json()["call_id"] for i in range(5)]
            for call_id in queued:
                record = http.get(f"/v1/calls/{call_id}", params={"wait": 60}).json()
                assert record["status"] == "succeeded" and record["output"]["version"] == label, record

        # Promote: v3 takes everything once it has v2's replicas; v2 drains.
        ember_cli("promote", APP, url=platform.url)
        wait_for(lambda: _traffic(http) == {3: 100}, timeout_s=60, what="the canary to take all traffic")
        wait_for(lambda: _running(http) == {3}, timeout_s=60, what="v2 to drain and stop")

        # Rollback: v2 starts again, then takes the calls back; --to goes further.
        ember_cli("rollback", APP, url=platform.url)
        wait_for(lambda: _traffic(http) == {2: 100}, timeout_s=120, what="the rollback to v2")
        ember_cli("rollback", APP, "--to", "1", url=platform.url)
        wait_for(lambda: _traffic(http) == {1: 100}, timeout_s=120, what="the rollback to v1")
        wait_for(lambda: _running(http) == {1}, timeout_s=60, what="v2 to drain and stop")
        time.sleep(0.5)
        listed = ember_cli("ls", url=platform.url).stdout
        assert "TRAFFIC" in listed and "v1 100%" in listed, listed
    finally:
        calls.stop.set()
        calls.thread.join(timeout=70)
    during = calls.since(started)
    errors = [c for c in during if c[2] != 200]
    assert errors == [], errors[:5]
    assert [c for c in during if c[4]] == []  # no call waited for a replica's setup
    print(f"slowest call while versions changed {max(c[1] for c in during):.3f}s, steady p99 {baseline:.3f}s")
    assert during[-1][3] == "one"
    assert Counter(c[3] for c in during).keys() == {"one", "two", "three"}
    records = [http.get(f"/v1/calls/{call_id}", params={"wait": 60}).json() for call_id in calls.spawned]
    assert len(records) > 20 and all(r.get("status") == "succeeded" for r in records), \
        [r for r in records if r.get("status") != "succeeded"][:3]


def test_pinning_and_rollouts_refuse_what_they_must(platform: EmbeddedPlatform, transport: Transport,
                                                    http: httpx.Client, ember_cli, tmp_path: Path) -> None:
    app = "pinned"
    source = tmp_path / f"{app}.py"
    source.write_text(SOURCE.format(app=app, version="a", setup_s=0, min_replicas=1))
    deploy(source, transport=transport, timeout_s=120)
    source.write_text(SOURCE.format(app=app, version="b", setup_s=0, min_replicas=1))
    deploy(source, transport=transport, timeout_s=120)
    wait_for(lambda: {r["version"] for s in _view(http, app)["services"] for r in s["replicas"]} == {2},
             timeout_s=60, what="v1 to stop")
    first = http.post(f"/v1/{app}@2/{FN}", json=1)
    assert first.status_code == 200 and first.json()["version"] == "b", first.text
    assert http.post(f"/v1/{app}@v2/{FN}", json=1).json()["version"] == "b"
    assert '"b"' in ember_cli("call", f"{app}@2.{FN}", "--data", "7", url=platform.url).stdout
    refused_cli = ember_cli("call", f"{app}@1.{FN}", "--data", "7", url=platform.url, check=False)
    assert refused_cli.returncode != 0 and "has no replicas" in refused_cli.stderr

    def refused(response: httpx.Response, status: int, field: str | None = None) -> str:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        if field is not None:
            assert error["field"] == field, error
        return str(error["message"])

    # Versions that are garbage, path-like or out of range: 422 naming the version; unknown or stopped: 404.
    for bad in ("abc", "0", "01", "-1", "1.0", "..", "%2e%2e", "2@2", "", "v", "99999999999", "1%00", "%20"):
        refused(http.post(f"/v1/{app}@{bad}/{FN}", json=1), 422, "version")
    for path in (f"/v1/{app}@..%2F..%2Fapps/{FN}", f"/v1/{app}@2/..%2F{FN}"):
        assert http.post(path, json=1).status_code in (404, 405, 422)
    assert "does not exist" in refused(http.post(f"/v1/{app}@7/{FN}", json=1), 404)
    assert "has no replicas" in refused(http.post(f"/v1/{app}@1/{FN}", json=1), 404)
    refused(http.post(f"/v1/{app}@zz/{FN}/spawn", json=1), 422, "version")
    assert "has no replicas" in refused(http.post(f"/v1/{app}@1/{FN}/spawn", json=1), 404)
    spawned = http.post(f"/v1/{app}@2/{FN}/spawn", json=5)
    assert spawned.status_code == 202, spawned.text
    record = http.get(f"/v1/calls/{spawned.json()['call_id']}", params={"wait": 60}).json()
    assert record["status"] == "succeeded" and record["output"]["version"] == "b" and record["output"]["x"] == 5, record

    # Rollback to a version the app does not keep (another app's), promote without a canary.
    other = tmp_path / "other"
    other.mkdir()
    for label in ("x", "y", "z"):
        (other / "others.py").write_text(SOURCE.format(app="others", version=label, setup_s=0, min_replicas=1))
        deploy(other / "others.py", transport=transport, timeout_s=120)
    assert _view(http, "others")["version"] == 3
    assert "no version 3" in refused(http.post(f"/v1/apps/{app}/rollback", json={"version": 3}), 404)
    assert "no canary" in refused(http.post(f"/v1/apps/{app}/promote"), 409)
    refused(http.post(f"/v1/apps/{app}/rollback", json={"version": "2"}), 422, "$.version")
    refused(http.post(f"/v1/apps/{app}/rollback", json={"version": -1}), 422, "$.version")
    refused(http.post(f"/v1/apps/{app}/rollback", json={"to": 1}), 422)
    refused(http.post(f"/v1/apps/{app}/rollback", content=b"{"), 400)
    refused(http.post(f"/v1/apps/{app}/rollback", content=b" " * 4096), 413)
    refused(http.post("/v1/apps/nosuchapp/rollback"), 404)
    assert _traffic_of(http, app) == {2: 100}

    # Tokens without the deploy scope, or for other apps.
    def token(scopes: list[str], apps: list[str] | None = None) -> dict[str, str]:
        body: dict[str, object] = {"scopes": scopes, "name": "rollouts"}
        if apps is not None:
            body["apps"] = apps
        created = http.post("/v1/tokens", json=body)
        assert created.status_code == 201, created.text
        return bearer(created.json()["token"])

    with httpx.Client(base_url=platform.url, timeout=60) as anon:
        for headers, status in ((token(["invoke"]), 403), (token(["read"]), 403),
                                (token(["deploy"], ["others"]), 404), ({}, 401)):
            refused(anon.post(f"/v1/apps/{app}/rollback", json={"version": 1}, headers=headers), status)
            refused(anon.post(f"/v1/apps/{app}/promote", headers=headers), status)
        refused(anon.post(f"/v1/{app}@2/{FN}", json=1, headers=token(["invoke"], ["others"])), 404)
        deployer = token(["deploy"], [app])
        assert anon.post(f"/v1/apps/{app}/rollback", json={"version": 1}, headers=deployer).status_code == 200
    wait_for(lambda: _traffic_of(http, app) == {1: 100}, timeout_s=60, what="the rollback to v1")
    assert http.post(f"/v1/{app}/{FN}", json=1).json()["version"] == "a"
    for name in (app, "others"):
        assert http.delete(f"/v1/apps/{name}").status_code == 204


def test_a_version_scaled_from_zero_is_replaced_warm(platform: EmbeddedPlatform, transport: Transport,
                                                    http: httpx.Client, tmp_path: Path) -> None:
    """With min_replicas=0, a version that serves (woken by calls) is replaced by one with a ready replica: the
    push starts one even though its minimum is zero, and no call waits for its setup."""
    app = "fromzero"
    source = write_app(tmp_path, "one", app, min_replicas=0)
    deploy(source, transport=transport, timeout_s=120)
    calls = Calls(platform.url, platform.token, app=app)
    calls.thread.start()
    try:
        wait_for(lambda: any(c[2] == 200 for c in calls.seen), timeout_s=120, what="a replica woken by calls")
        wait_for(lambda: len(calls.seen) >= 100, timeout_s=60, what="steady calls")
        started = time.monotonic()
        write_app(tmp_path, "two", app, min_replicas=0)
        deploy(source, transport=transport, timeout_s=120)
        assert _traffic_of(http, app) == {2: 100}
        wait_for(lambda: _running(http, app) == {2}, timeout_s=60, what="v1 to drain and stop")
    finally:
        calls.stop.set()
        calls.thread.join(timeout=70)
        seen = http.get(f"/v1/apps/{app}").text  # its replicas and their starts, for a failure's message
        http.delete(f"/v1/apps/{app}")
    during = calls.since(started)
    assert [c for c in during if c[2] != 200] == []
    # No call waited for the new version's setup: its calls went to it from the switch on, and its replica was
    # ready before (a call sent before it was ready may be answered after the switch by a gateway short of CPU).
    switched_at = msgspec.json.decode(seen)["switched_at"]
    late = {c[5] for c in during if c[3] == "two" and c[5] > switched_at}
    assert not late, (late, switched_at, seen)
    assert during[-1][3] == "two"


def test_every_control_plane_routes_alike(platform: TestPlatform, transport: Transport, http: httpx.Client,
                                          ember_cli, tmp_path: Path) -> None:
    """The traffic split lives in the deployments KV: a second control plane (a standby) answers the same shares,
    takes a rollback, and routes pinned and unpinned calls as the first does."""
    app = "twocp"
    source = tmp_path / f"{app}.py"
    source.write_text(SOURCE.format(app=app, version="a", setup_s=0, min_replicas=1))
    deploy(source, transport=transport, timeout_s=120)
    source.write_text(SOURCE.format(app=app, version="b", setup_s=0, min_replicas=1))
    for bad in ("0", "100", "x", "-5"):
        refused = ember_cli("push", str(source), "--canary", bad, url=platform.url, check=False)
        assert refused.returncode == 2 and "share of calls from 1 to 99" in refused.stderr, refused.stderr
    pushed = ember_cli("push", str(source), "--canary", "50%", url=platform.url).stdout
    assert "twocp v2 is deployed (traffic: v1 50%, v2 50% (canary))" in pushed, pushed
    url = platform.add_control_plane("rollouts-cp2")
    try:
        with httpx.Client(base_url=url, headers=bearer(platform.token), timeout=60) as other:
            wait_for(lambda: _traffic_of(other, app) == _traffic_of(http, app) == {1: 50, 2: 50}, timeout_s=30,
                     what="the standby to see the canary")
            labels = {other.post(f"/v1/{app}/{FN}", json=i).json()["version"] for i in range(40)}
            assert labels == {"a", "b"}
            assert other.post(f"/v1/{app}@1/{FN}", json=1).json()["version"] == "a"
            assert other.post(f"/v1/apps/{app}/rollback").status_code == 200  # through the standby
            wait_for(lambda: _traffic_of(http, app) == {1: 100}, timeout_s=30, what="the first to see the rollback")
            assert {http.post(f"/v1/{app}/{FN}", json=i).json()["version"] for i in range(10)} == {"a"}
    finally:
        platform.kill("rollouts-cp2")
        http.delete(f"/v1/apps/{app}")


def _traffic_of(http: httpx.Client, app: str) -> dict[int, int]:
    return {v["version"]: v["percent"] for v in _view(http, app)["versions"] if v["percent"]}
