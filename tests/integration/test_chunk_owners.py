"""A chunk's hash is no proof of ownership: a tenant (a deploy token for ``tenant-*``) that learns the sha256 of
another's chunk (``team-b-*``) cannot name it in a version of its own volume, and "which are missing" says missing;
once it sends the same bytes itself it may, and they are stored once (see ``volumes.store``)."""

from __future__ import annotations

import hashlib
import os
import uuid
from contextlib import closing
from pathlib import Path

import httpx
import pytest
from support.owners import deploy_token, owners_of, stored_copy

from ember._client import Transport
from ember._volume import CHUNKS_PATH, PutProgress, put_volume
from ember.wire import subjects

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_a_chunk_uploaded_by_another_tenant_is_missing_to_this_one(platform, http: httpx.Client) -> None:
    """A chunk's hash is no proof of ownership: ``tenant-*`` naming ``team-b-*``'s chunk is answered exactly as for
    a chunk never uploaded, and "which are missing" says missing; once it uploads the same bytes itself it may name
    them, and they are stored once."""
    data = os.urandom(4096)
    sha, never = hashlib.sha256(data).hexdigest(), "cd" * 32
    team_b, tenant = deploy_token(http, ["team-b-*"]), deploy_token(http, ["tenant-*"])
    theirs, mine = f"team-b-{uuid.uuid4().hex[:6]}", f"tenant-{uuid.uuid4().hex[:6]}"

    def files(chunk: str) -> dict[str, list[dict[str, object]]]:
        return {"files": [{"path": "w.bin", "size": len(data), "chunks": [chunk]}]}

    with httpx.Client(base_url=platform.url, timeout=60) as client:
        assert client.put(f"{CHUNKS_PATH}/{sha}", content=data, headers=team_b).status_code == 201
        assert client.post(f"/v1/volumes/{theirs}/versions", json=files(sha), headers=team_b).status_code == 201
        assert client.post(f"{CHUNKS_PATH}/missing", json={"chunks": [sha]}, headers=team_b).json()["missing"] == []

        asked = client.post(f"{CHUNKS_PATH}/missing", json={"chunks": [sha, never]}, headers=tenant)
        assert asked.json()["missing"] == [sha, never]
        stolen = client.post(f"/v1/volumes/{mine}/versions", json=files(sha), headers=tenant)
        unknown = client.post(f"/v1/volumes/{mine}/versions", json=files(never), headers=tenant)
        assert stolen.status_code == unknown.status_code == 409, stolen.text
        assert stolen.json()["error"] == {**unknown.json()["error"],
                                          "message": unknown.json()["error"]["message"].replace(never, sha)}
        assert client.get(f"/v1/volumes/{mine}", headers=tenant).status_code == 404

        stored = stored_copy(platform.nats_url, subjects.VOLUME_CHUNKS_STORE, sha)
        own = client.put(f"{CHUNKS_PATH}/{sha}", content=data, headers=tenant)
        assert own.status_code == 201 and own.json()["created"] is True  # new to this tenant: no hint
        assert stored_copy(platform.nats_url, subjects.VOLUME_CHUNKS_STORE, sha) == stored  # the bytes stored once
        assert client.post(f"{CHUNKS_PATH}/missing", json={"chunks": [sha]}, headers=tenant).json()["missing"] == []
        made = client.post(f"/v1/volumes/{mine}/versions", json=files(sha), headers=tenant)
        assert made.status_code == 201, made.text
        again = client.put(f"{CHUNKS_PATH}/{sha}", content=data, headers=team_b)
        assert again.status_code == 200 and again.json()["created"] is False
    assert owners_of(platform.nats_url, "chunk", sha) == ["team-b-*", "tenant-*"]
    for name in (theirs, mine):
        assert http.delete(f"/v1/volumes/{name}").status_code == 204
    # Uploaded by two tenants, it is not deleted with either's volume: another may be putting it in a volume still
    # (test_removing_a_volume_keeps_a_chunk_another_tenant_is_putting); the collection after the grace takes it.
    assert owners_of(platform.nats_url, "chunk", sha) == ["team-b-*", "tenant-*"]


def test_two_tenants_put_the_same_weights_with_the_sdk_and_each_sends_its_own_copy(platform, http: httpx.Client,
                                                                                     tmp_path: Path) -> None:
    """Through ``ember volume put``'s own code: the second tenant is told the chunks are missing, sends them (so it
    proves it holds the bytes), and its version is made; the bytes are stored once. Its second put sends none."""
    def transport(apps: list[str]) -> Transport:
        return Transport(platform.url, token=deploy_token(http, apps)["Authorization"].split()[1])

    source = tmp_path / "w.bin"
    source.write_bytes(os.urandom(3 * 1024))
    sha = hashlib.sha256(source.read_bytes()).hexdigest()
    theirs, mine = f"team-b-{uuid.uuid4().hex[:6]}", f"tenant-{uuid.uuid4().hex[:6]}"
    puts: dict[str, list[PutProgress]] = {theirs: [], mine: []}
    with closing(transport(["team-b-*"])) as team_b, closing(transport(["tenant-*"])) as tenant:
        put_volume(theirs, [source], transport=team_b, progress=puts[theirs].append)
        stored = stored_copy(platform.nats_url, subjects.VOLUME_CHUNKS_STORE, sha)
        put_volume(mine, [source], transport=tenant, progress=puts[mine].append)
        assert puts[mine][-1].sent_chunks == 1 and puts[mine][-1].skipped_chunks == 0
        assert stored_copy(platform.nats_url, subjects.VOLUME_CHUNKS_STORE, sha) == stored
        again: list[PutProgress] = []
        assert put_volume(mine, [source], transport=tenant, progress=again.append).version == 2
        assert again[-1].sent_chunks == 0 and again[-1].skipped_chunks == 1
    for name in (theirs, mine):
        assert http.delete(f"/v1/volumes/{name}").status_code == 204


def test_an_admins_chunk_for_one_volume_is_missing_to_a_tenant(platform, http: httpx.Client) -> None:
    """An admin's upload names the volume it is for (``put_volume`` does): recorded for that volume alone, a tenant
    that knows its hash must send the bytes itself. Recorded as ``'*'``, the tenant named it in a volume of its own
    and mounted another team's weights."""
    data = os.urandom(4096)
    sha = hashlib.sha256(data).hexdigest()
    theirs, mine = f"ops-{uuid.uuid4().hex[:6]}", f"tenant-{uuid.uuid4().hex[:6]}"
    tenant = deploy_token(http, ["tenant-*"])
    files = {"files": [{"path": "w.bin", "size": len(data), "chunks": [sha]}]}
    assert http.put(f"{CHUNKS_PATH}/{sha}", params={"volume": theirs}, content=data).status_code == 201
    assert http.post(f"/v1/volumes/{theirs}/versions", json=files).status_code == 201
    assert owners_of(platform.nats_url, "chunk", sha) == [theirs]
    with httpx.Client(base_url=platform.url, timeout=60) as client:
        assert client.post(f"{CHUNKS_PATH}/missing", json={"chunks": [sha]}, headers=tenant).json()["missing"] == [sha]
        stolen = client.post(f"/v1/volumes/{mine}/versions", json=files, headers=tenant)
        assert stolen.status_code == 409, stolen.text
        unseen = client.put(f"{CHUNKS_PATH}/{sha}", params={"volume": theirs}, content=data, headers=tenant)
        assert unseen.status_code == 403 and unseen.json()["error"]["field"] == "volume", unseen.text
    assert http.delete(f"/v1/volumes/{theirs}").status_code == 204


def test_removing_a_volume_keeps_a_chunk_another_tenant_is_putting(platform, http: httpx.Client) -> None:
    """Tenant b sent the same bytes as tenant a's volume holds, and has not committed its own volume yet when a
    removes its: the chunk stays (for the grace an upload has), and b's commit finds it. Deleted at once with a's
    volume, b's commit was a 409."""
    data = os.urandom(4096)
    sha = hashlib.sha256(data).hexdigest()
    team_a, team_b = deploy_token(http, ["team-a-*"]), deploy_token(http, ["team-b-*"])
    mine, theirs = f"team-a-{uuid.uuid4().hex[:6]}", f"team-b-{uuid.uuid4().hex[:6]}"
    files = {"files": [{"path": "w.bin", "size": len(data), "chunks": [sha]}]}
    with httpx.Client(base_url=platform.url, timeout=60) as client:
        assert client.put(f"{CHUNKS_PATH}/{sha}", content=data, headers=team_a).status_code == 201
        assert client.post(f"/v1/volumes/{mine}/versions", json=files, headers=team_a).status_code == 201
        assert client.put(f"{CHUNKS_PATH}/{sha}", content=data, headers=team_b).status_code == 201  # its own copy
        assert client.delete(f"/v1/volumes/{mine}", headers=team_a).status_code == 204
        made = client.post(f"/v1/volumes/{theirs}/versions", json=files, headers=team_b)
        assert made.status_code == 201, made.text
    assert http.delete(f"/v1/volumes/{theirs}").status_code == 204
