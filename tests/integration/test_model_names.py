"""Served model names are unique across the platform, claimed atomically in ``ember_models``: of two pushes of
different apps naming one model at once, through two control planes, exactly one wins and the other is a 409 naming
the field; the name is kept by new versions of its app and released when the app is deleted or a version that drops
it takes the traffic; another tenant's replica can neither read, watch nor write the claims."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from pathlib import Path

import httpx
import msgspec
import pytest
from support.auth import authed_client
from support.natsconn import connect
from support.paths import REPO
from support.platform import TestPlatform
from support.polling import wait_for

from ember._bundle import build_bundle
from ember._deploy import inspect_app
from ember.wire import DeployRequest, Manifest, encoder, subjects
from ember_platform.control.models import STALE_S, ModelClaim

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
              pytest.mark.usefixtures("collect_refused_sockets")]
APP = REPO / "tests" / "apps" / "llm" / "claim.py"
FIELD = "$.manifest.services[0].functions[0].openai"
ROUNDS = 4



def _manifest(base: Manifest, app: str, model: str, timeout_s: float = 60.0) -> Manifest:
    svc = base.services[0]
    fn = msgspec.structs.replace(svc.functions[0], openai=model)
    svc = msgspec.structs.replace(svc, functions=[fn], timeout_s=timeout_s)
    return msgspec.structs.replace(base, app=app, services=[svc])


def _push(http: httpx.Client, url: str, sha: str, manifest: Manifest) -> httpx.Response:
    return http.post(f"{url}/v1/apps/{manifest.app}/deployments",
                     content=encoder.encode(DeployRequest(bundle_sha256=sha, manifest=manifest)),
                     headers={"content-type": "application/json"})


def test_two_pushes_at_once_through_two_control_planes_one_wins(tmp_path: Path):
    base = inspect_app(APP)
    bundle = build_bundle(APP.parent)
    with TestPlatform(tmp_path / "state") as cluster, authed_client(cluster, base_url="", timeout=60) as http:
        urls = [cluster.url, cluster.add_control_plane("platform-b")]
        for url in urls:
            assert http.put(f"{url}/v1/bundles/{bundle.sha256}", content=bundle.data,
                            headers={"content-type": "application/gzip"}).status_code in (200, 201)
        for n in range(ROUNDS):
            model = f"race-{n}"
            rivals = [_manifest(base, f"race-{side}-{n}", model) for side in "ab"]
            start = threading.Barrier(2)

            def push(i: int, model: str = model, rivals: list[Manifest] = rivals,
                     start: threading.Barrier = start) -> httpx.Response:
                start.wait()
                return _push(http, urls[i], bundle.sha256, rivals[i])

            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                answers = list(pool.map(push, range(2)))
            codes = sorted(a.status_code for a in answers)
            assert codes == [201, 409], [a.text for a in answers]
            lost = next(a for a in answers if a.status_code == 409).json()["error"]
            assert lost["field"] == FIELD and model in lost["message"], lost
            winner = next(m for m, a in zip(rivals, answers, strict=True) if a.status_code == 201).app
            loser = next(m for m in rivals if m.app != winner)
            served = [d for url in urls for d in http.get(f"{url}/openai/v1/models").json()["data"]
                      if d["id"] == model]
            assert served and all(d["owned_by"] == winner for d in served), served

        # A new version of the winner keeps its name; one that drops it releases it once it takes the traffic.
        keeps = _manifest(base, winner, model, timeout_s=30.0)
        assert _push(http, urls[1], bundle.sha256, keeps).status_code == 201
        assert _push(http, urls[0], bundle.sha256, loser).status_code == 409
        drops = _manifest(base, winner, "")
        assert _push(http, urls[0], bundle.sha256, drops).status_code == 201
        wait_for(lambda: _push(http, urls[1], bundle.sha256, loser).status_code == 201, timeout_s=60,
                 what="the dropped name to be released")
        # Deleting an app releases its names.
        assert http.delete(f"{urls[1]}/v1/apps/{loser.app}").status_code in (200, 204)  # where it was pushed
        assert _push(http, urls[1], bundle.sha256, _manifest(base, "race-c", model)).status_code == 201


def test_another_tenants_replica_cannot_touch_the_claims(deployed, http):
    deployed(APP.parent / "llm.py")
    deployed(REPO / "tests" / "apps" / "intruder" / "intruder.py")
    key = subjects.model_key("echo-words")
    seen = http.post("/v1/intruder/claim_model", json={"key": key}, timeout=120).json()
    assert len(seen) == 6
    for attempt, answer in seen.items():
        assert "permissions violation" in answer.lower(), (attempt, answer)
    owner = next(d for d in http.get("/openai/v1/models").json()["data"] if d["id"] == "echo-words")["owned_by"]
    assert owner == "llm"
    taken = _manifest(inspect_app(APP), "llm-claim", "echo-words")
    bundle = build_bundle(APP.parent)
    http.put(f"/v1/bundles/{bundle.sha256}", content=bundle.data, headers={"content-type": "application/gzip"})
    answer = _push(http, "", bundle.sha256, taken)
    assert answer.status_code == 409 and answer.json()["error"]["field"] == FIELD, answer.text


def test_a_claim_left_behind_is_taken_over_only_once_old(platform, http):
    """A control plane that died between claiming a name and recording its push leaves a claim whose app serves no
    such model: a push in progress elsewhere looks the same while it is fresh (409), and it is taken once old."""
    base, bundle = inspect_app(APP), build_bundle(APP.parent)
    http.put(f"/v1/bundles/{bundle.sha256}", content=bundle.data, headers={"content-type": "application/gzip"})

    async def claim(claimed_at: float) -> None:
        nc = await connect(platform.nats_url)
        kv = await nc.jetstream().key_value(subjects.MODELS_BUCKET)
        await kv.put(subjects.model_key("left-behind"),
                     msgspec.json.encode(ModelClaim(model="left-behind", app="never-recorded", claimed_at=claimed_at)))
        await nc.close()

    late = _manifest(base, "llm-claim-late", "left-behind")
    asyncio.run(claim(time.time()))
    answer = _push(http, "", bundle.sha256, late)
    assert answer.status_code == 409 and answer.json()["error"]["field"] == FIELD, answer.text
    asyncio.run(claim(time.time() - STALE_S - 1))
    assert _push(http, "", bundle.sha256, late).status_code == 201
    assert http.delete("/v1/apps/llm-claim-late").status_code in (200, 204)
