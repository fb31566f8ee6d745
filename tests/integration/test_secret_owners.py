"""Secrets across tenants, against the real platform: an admin sets ``team-b-db`` for the apps ``team-b-*``; a
deploy token scoped to ``tenant-*`` cannot push an app that declares it (refused in the very words of a secret that
does not exist), a ``team-b-*`` token can and its replica gets the value; narrowing the secret's apps afterwards
stops the node agent from getting it for a new replica; a secret stored before secrets had app patterns serves no
app, and a push naming it says so to an admin."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import msgspec
import pytest
from support.auth import bearer
from support.natsconn import connect as admin_connect
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy
from ember._errors import InvalidInputError
from ember.wire import AppView, NewToken, SecretView, encoder, subjects

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

APP = '''import os
import ember
app = ember.App("{name}")

@app.function(secrets=["{secret}"])
def reveal(key: str) -> str:
    return os.environ.get(key, "<unset>")
'''


def _app(tmp_path: Path, name: str, secret: str) -> Path:
    folder = tmp_path / f"{name}-{secret}"
    folder.mkdir()
    path = folder / f"{name.replace('-', '_')}.py"
    path.write_text(APP.format(name=name, secret=secret))
    return path


def _token(http: httpx.Client, apps: list[str]) -> str:
    made = http.post("/v1/tokens", json={"scopes": ["deploy", "invoke"], "apps": apps, "name": "secret-owners"})
    assert made.status_code == 201, made.text
    return msgspec.json.decode(made.content, type=NewToken).token


@pytest.fixture
def team_b_db(http: httpx.Client) -> Iterator[str]:
    """The secret ``team-b-db`` for the apps ``team-b-*``: its password."""
    password = f"pw-{uuid.uuid4().hex}"
    put = http.put("/v1/secrets/team-b-db", json={"values": {"DB_PASSWORD": password}, "apps": ["team-b-*"]})
    assert put.status_code == 200, put.text
    assert msgspec.json.decode(put.content, type=SecretView).apps == ["team-b-*"]
    yield password
    http.delete("/v1/secrets/team-b-db")


def test_another_tenants_token_cannot_push_an_app_declaring_the_secret_and_learns_nothing_of_it(
        platform, http: httpx.Client, team_b_db: str, tmp_path: Path) -> None:
    with closing(Transport(platform.url, token=_token(http, ["tenant-*"]))) as tenant:
        refusals = []
        for secret in ("team-b-db", "st-never-set"):
            with pytest.raises(InvalidInputError) as caught:
                deploy(_app(tmp_path, "tenant-x", secret), transport=tenant, timeout_s=60)
            assert caught.value.field == "$.manifest.services[0].secrets[0]"
            refusals.append(caught.value.message.replace(secret, "NAME"))
        assert refusals[0] == refusals[1]  # as for a secret that does not exist: no hint that this one does
        assert "team-b-*" not in refusals[0] and team_b_db not in refusals[0]
    assert http.get("/v1/apps/tenant-x").status_code == 404


def test_the_owning_team_gets_it_and_a_narrowed_secret_is_refused_to_a_new_replica(
        platform, http: httpx.Client, team_b_db: str, tmp_path: Path) -> None:
    token = _token(http, ["team-b-*"])
    try:
        with closing(Transport(platform.url, token=token)) as team_b:
            deploy(_app(tmp_path, "team-b-x", "team-b-db"), transport=team_b, timeout_s=120)
        reveal = httpx.post(f"{platform.url}/v1/team-b-x/reveal", json="DB_PASSWORD", headers=bearer(token),
                            timeout=60)
        assert reveal.json() == team_b_db

        narrowed = http.put("/v1/secrets/team-b-db", json={"values": {"DB_PASSWORD": team_b_db}, "apps": ["team-b-y"]})
        assert narrowed.status_code == 200, narrowed.text
        scaled = http.post("/v1/apps/team-b-x/scale", json={"service": "reveal", "min_replicas": 2, "max_replicas": 2})
        assert scaled.status_code == 200, scaled.text
        refused = wait_for(lambda: _messages(http, "team-b-x", "does not exist for app 'team-b-x'"), timeout_s=120,
                           what="the new replica's status to show its secrets refused")
        assert team_b_db not in " ".join(refused)
        assert http.post("/v1/team-b-x/reveal", json="DB_PASSWORD").json() == team_b_db  # it keeps what it got
    finally:
        http.delete("/v1/apps/team-b-x")


def _messages(http: httpx.Client, app: str, needle: str) -> list[str]:
    view = msgspec.json.decode(http.get(f"/v1/apps/{app}").content, type=AppView)
    return [r.message for s in view.services for r in s.replicas if needle in r.message]


def test_a_secret_needs_its_apps_and_one_stored_without_them_serves_no_app(platform, http: httpx.Client,
                                                                           transport: Transport,
                                                                           tmp_path: Path) -> None:
    missing = http.put("/v1/secrets/st-owned", json={"values": {"A": "b"}})
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "$.apps"
    assert "'*' for every app" in missing.json()["error"]["message"]
    asyncio.run(_store_without_apps(platform.nats_url, "st-legacy"))
    try:
        listed = wait_for(lambda: [v for v in _secrets(http) if v.name == "st-legacy"], timeout_s=30,
                          what="the record stored without apps to be listed")
        assert listed[0].apps == []
        with pytest.raises(InvalidInputError) as caught:
            deploy(_app(tmp_path, "legacy-user", "st-legacy"), transport=transport, timeout_s=60)
        assert "no app patterns" in caught.value.message and "--apps" in caught.value.message
    finally:
        http.delete("/v1/secrets/st-legacy")


def _secrets(http: httpx.Client) -> list[SecretView]:
    return msgspec.json.decode(http.get("/v1/secrets").content, type=list[SecretView])


async def _store_without_apps(url: str, name: str) -> None:
    """A record as the bucket held it before secrets had app patterns."""
    nc = await admin_connect(url)
    try:
        kv = await nc.jetstream().key_value(subjects.SECRETS_BUCKET)
        await kv.put(name, encoder.encode({"name": name, "keys": ["OLD_KEY"], "ciphertext": "x"}))
    finally:
        await nc.close()
