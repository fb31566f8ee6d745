"""A bundle's hash is no proof of ownership: one tenant (a deploy token for ``tenant-*``) that learns the sha256 of
another's bundle (``team-b-*``) cannot deploy it, and is answered exactly as for a bundle never uploaded; once it
uploads the same bytes itself it can, and the bytes are stored once."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.owners import deploy_token, stored_copy

from ember._bundle import build_bundle
from ember.wire import subjects

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _deploy_request(app: str, sha: str) -> dict[str, Any]:
    """A deployment that starts no replica (``min_replicas=0``): only its bundle is at stake here."""
    return {"bundle_sha256": sha, "manifest": {"app": app, "module": "m", "services": [{
        "name": "f", "kind": "function", "min_replicas": 0,
        "functions": [{"name": "f", "attr": "f", "input_mode": "single"}]}]}}


def test_a_bundle_uploaded_by_another_tenant_cannot_be_deployed_by_its_hash(platform, http: httpx.Client,
                                                                            tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(f"# team b's code {uuid.uuid4().hex}\ndef f(x): return x\n")
    bundle = build_bundle(tmp_path)
    team_b, tenant = deploy_token(http, ["team-b-*"]), deploy_token(http, ["tenant-*"])
    theirs, mine = f"team-b-{uuid.uuid4().hex[:6]}", f"tenant-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=platform.url, timeout=60) as client:
        assert client.put(f"/v1/bundles/{bundle.sha256}", content=bundle.data, headers=team_b).status_code == 201
        deployed = client.post(f"/v1/apps/{theirs}/deployments", json=_deploy_request(theirs, bundle.sha256),
                               headers=team_b)
        assert deployed.status_code == 201, deployed.text
        try:
            stolen = client.post(f"/v1/apps/{mine}/deployments", json=_deploy_request(mine, bundle.sha256),
                                 headers=tenant)
            never = "ab" * 32
            unknown = client.post(f"/v1/apps/{mine}/deployments", json=_deploy_request(mine, never), headers=tenant)
            assert stolen.status_code == unknown.status_code == 404, stolen.text
            assert stolen.json()["error"] == {**unknown.json()["error"],
                                              "message": unknown.json()["error"]["message"].replace(never,
                                                                                                    bundle.sha256)}
            assert stolen.json()["error"]["field"] == "$.bundle_sha256"
            assert client.get(f"/v1/apps/{mine}", headers=tenant).status_code == 404
            build = {"module": "m", "images": [{"packages": ["emberprobe"]}]}  # nor run it in a build
            built = client.post(f"/v1/apps/{mine}/builds", json={"bundle_sha256": bundle.sha256, **build},
                                headers=tenant)
            built_unknown = client.post(f"/v1/apps/{mine}/builds", json={"bundle_sha256": never, **build},
                                        headers=tenant)
            assert built.status_code == built_unknown.status_code == 404, built.text
            assert built.json()["error"]["message"] == built_unknown.json()["error"]["message"].replace(
                never, bundle.sha256)

            stored = stored_copy(platform.nats_url, subjects.BUNDLES_STORE, bundle.sha256)
            again = client.put(f"/v1/bundles/{bundle.sha256}", content=bundle.data, headers=tenant)
            assert again.status_code == 201 and again.json()["created"] is True  # new to this tenant: no hint
            assert stored_copy(platform.nats_url, subjects.BUNDLES_STORE, bundle.sha256) == stored  # stored once
            owned = client.post(f"/v1/apps/{mine}/deployments", json=_deploy_request(mine, bundle.sha256),
                                headers=tenant)
            assert owned.status_code == 201, owned.text
            repeat = client.put(f"/v1/bundles/{bundle.sha256}", content=bundle.data, headers=team_b)
            assert repeat.status_code == 200 and repeat.json()["created"] is False
        finally:
            http.delete(f"/v1/apps/{theirs}")
            http.delete(f"/v1/apps/{mine}")


def test_a_narrower_token_of_the_same_tenant_deploys_what_a_wider_one_uploaded(platform, http: httpx.Client,
                                                                               tmp_path: Path) -> None:
    """Patterns are matched against the app's name: ``team-b-*``'s upload serves ``team-b-api``'s own token, and
    an admin's upload (``'*'``) serves every app."""
    (tmp_path / "m.py").write_text(f"# shared {uuid.uuid4().hex}\n")
    bundle = build_bundle(tmp_path)
    app = f"team-b-api-{uuid.uuid4().hex[:4]}"
    with httpx.Client(base_url=platform.url, timeout=60) as client:
        assert client.put(f"/v1/bundles/{bundle.sha256}", content=bundle.data,
                          headers=deploy_token(http, ["team-b-*"])).status_code == 201
        narrow = client.post(f"/v1/apps/{app}/deployments", json=_deploy_request(app, bundle.sha256),
                             headers=deploy_token(http, [app]))
        assert narrow.status_code == 201, narrow.text
        http.delete(f"/v1/apps/{app}")
        (tmp_path / "m.py").write_text(f"# the admin's {uuid.uuid4().hex}\n")
        admins = build_bundle(tmp_path)
        assert http.put(f"/v1/bundles/{admins.sha256}", content=admins.data).status_code == 201
        anyone = client.post(f"/v1/apps/{app}/deployments", json=_deploy_request(app, admins.sha256),
                             headers=deploy_token(http, [app]))
        assert anyone.status_code == 201, anyone.text
        http.delete(f"/v1/apps/{app}")


def test_an_admins_bundle_for_one_app_cannot_be_deployed_by_a_tenant_by_its_hash(platform, http: httpx.Client,
                                                                                tmp_path: Path) -> None:
    """An admin's upload names the app it is for (``ember push`` does): it is recorded for that app alone. Recorded
    as ``'*'``, it was deployable by any tenant that knew its hash, and ran another team's code in its replicas."""
    (tmp_path / "m.py").write_text(f"# the admin's app {uuid.uuid4().hex}\ndef f(x): return x\n")
    bundle = build_bundle(tmp_path)
    theirs, mine = f"ops-{uuid.uuid4().hex[:6]}", f"tenant-{uuid.uuid4().hex[:6]}"
    tenant = deploy_token(http, ["tenant-*"])
    with httpx.Client(base_url=platform.url, timeout=60) as client:
        put = http.put(f"/v1/bundles/{bundle.sha256}", params={"app": theirs}, content=bundle.data)
        assert put.status_code == 201, put.text
        assert http.post(f"/v1/apps/{theirs}/deployments", json=_deploy_request(theirs, bundle.sha256)).status_code \
            == 201
        try:
            stolen = client.post(f"/v1/apps/{mine}/deployments", json=_deploy_request(mine, bundle.sha256),
                                 headers=tenant)
            assert stolen.status_code == 404, stolen.text
            unseen = client.put(f"/v1/bundles/{bundle.sha256}", params={"app": theirs}, content=bundle.data,
                                headers=tenant)
            assert unseen.status_code == 403 and unseen.json()["error"]["field"] == "app", unseen.text
            bad = http.put(f"/v1/bundles/{bundle.sha256}", params={"app": "Not An App"}, content=bundle.data)
            assert bad.status_code == 422 and bad.json()["error"]["field"] == "app", bad.text
        finally:
            http.delete(f"/v1/apps/{theirs}")
