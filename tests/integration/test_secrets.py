"""Secrets against the real platform: set over HTTP (admin only, with the apps that may use them), delivered to a
replica's environment at its start, never shown (not in the list, the app, the status, the logs, the deployment's
KV entry, nor in clear in their own bucket); a replica may not ask for them, and a node only for its own replicas.
Which tenant's apps may use a secret: ``test_secret_owners``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import msgspec
import nats
import pytest
from support.auth import bearer
from support.natsconn import connect as admin_connect

from ember._client import Transport
from ember._deploy import deploy
from ember._errors import InvalidInputError
from ember.wire import NewToken, SecretsAnswer, SecretsRequest, SecretView, encoder, subjects
from ember.wire.natscreds import read_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]

APP = '''import os
import ember
app = ember.App("{name}")

@app.function(secrets=["{secret}"])
def reveal(key: str) -> str:
    return os.environ.get(key, "<unset>")

@app.function()
def plain(key: str) -> str:
    return os.environ.get(key, "<unset>")
'''


def _app(tmp_path: Path, name: str, secret: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    path = folder / f"{name.replace('-', '_')}.py"
    path.write_text(APP.format(name=name, secret=secret))
    return path


def test_a_secret_reaches_its_replicas_environment_and_nothing_else(platform, http: httpx.Client,
                                                                    transport: Transport, tmp_path: Path) -> None:
    value = f"hf_{uuid.uuid4().hex}"
    put = http.put("/v1/secrets/st-hf", json={"values": {"HF_TOKEN": value, "OTHER_KEY": "two"},
                                              "apps": ["secret-user"]})
    assert put.status_code == 200, put.text
    assert value not in put.text and msgspec.json.decode(put.content, type=SecretView).keys == ["HF_TOKEN",
                                                                                                  "OTHER_KEY"]
    try:
        deploy(_app(tmp_path, "secret-user", "st-hf"), transport=transport, timeout_s=120)
        assert http.post("/v1/secret-user/reveal", json="HF_TOKEN").json() == value
        assert http.post("/v1/secret-user/reveal", json="OTHER_KEY").json() == "two"
        assert http.post("/v1/secret-user/plain", json="HF_TOKEN").json() == "<unset>"  # it did not declare it

        listed = http.get("/v1/secrets")
        assert listed.status_code == 200 and value not in listed.text
        assert {v.name: v.keys for v in msgspec.json.decode(listed.content, type=list[SecretView])}["st-hf"] == [
            "HF_TOKEN", "OTHER_KEY"]
        for path in ("/v1/apps/secret-user", "/v1/status", "/v1/apps/secret-user/logs", "/metrics"):
            answer = http.get(path)
            assert answer.status_code == 200 and value not in answer.text, path
        for log in Path(platform.log_dir).rglob("*"):
            if log.is_file():
                assert value.encode() not in log.read_bytes(), log
        deployment, stored = asyncio.run(_raw(platform.nats_url, "secret-user", "st-hf"))
        assert b"st-hf" in deployment and value.encode() not in deployment
        assert b"HF_TOKEN" in stored and value.encode() not in stored  # the value is encrypted at rest
    finally:
        http.delete("/v1/apps/secret-user")
        http.delete("/v1/secrets/st-hf")


def test_pushing_an_app_that_names_a_missing_secret_is_a_422_naming_it(http: httpx.Client, transport: Transport,
                                                                       tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError) as caught:
        deploy(_app(tmp_path, "secret-missing", "st-nowhere"), transport=transport, timeout_s=60)
    assert caught.value.field == "$.manifest.services[0].secrets[0]" and "st-nowhere" in caught.value.message
    assert http.get("/v1/apps/secret-missing").status_code == 404


def test_the_routes_are_the_admins_and_check_what_they_are_given(http: httpx.Client) -> None:
    made = http.post("/v1/tokens", json={"scopes": ["deploy", "invoke", "read"], "apps": ["*"]})
    deployer = msgspec.json.decode(made.content, type=NewToken).token
    for method, path in (("GET", "/v1/secrets"), ("PUT", "/v1/secrets/st-x"), ("DELETE", "/v1/secrets/st-x")):
        answer = httpx.request(method, f"{http.base_url}{path}", headers=bearer(deployer),
                               json={"values": {"A": "b"}, "apps": ["*"]})
        assert answer.status_code == 403, (method, path, answer.text)
        assert httpx.request(method, f"{http.base_url}{path}").status_code == 401
    bad = [
        ("/v1/secrets/Bad_Name", {"values": {"A": "b"}, "apps": ["*"]}, 422, "secret"),
        ("/v1/secrets/st-x", {"values": {"lower": "b"}, "apps": ["*"]}, 422, "$.values.lower"),
        ("/v1/secrets/st-x", {"values": {"EMBER_NATS_CREDS": "b"}, "apps": ["*"]}, 422, "$.values.EMBER_NATS_CREDS"),
        ("/v1/secrets/st-x", {"values": {"LD_PRELOAD": "/x.so"}, "apps": ["*"]}, 422, "$.values.LD_PRELOAD"),
        ("/v1/secrets/st-x", {"values": {"PATH": "/x"}, "apps": ["*"]}, 422, "$.values.PATH"),
        ("/v1/secrets/st-x", {"values": {}, "apps": ["*"]}, 422, "$.values"),
        ("/v1/secrets/st-x", {"values": {"A": "b"}}, 422, "$.apps"),
        ("/v1/secrets/st-x", {"values": {"A": "b"}, "apps": []}, 422, "$.apps"),
        ("/v1/secrets/st-x", {"values": {"A": "b"}, "apps": ["ok", "Bad App"]}, 422, "$.apps[1]"),
        ("/v1/secrets/st-x", {"values": {"A": 1}, "apps": ["*"]}, 422, None),
        ("/v1/secrets/st-x", {"values": {"A": "b"}, "apps": ["*"], "extra": 1}, 422, None),
        ("/v1/secrets/st-x", {"values": {"A": "x" * 40_000}, "apps": ["*"]}, 413, None),
        # more keys than the document's maxProperties: refused as any body the schema does not allow
        ("/v1/secrets/st-x", {"values": {f"K{i}": "v" for i in range(100)}, "apps": ["*"]}, 422, "$.values"),
    ]
    for path, body, status, field in bad:
        answer = http.put(path, json=body)
        assert answer.status_code == status, (body if len(str(body)) < 200 else path, answer.text[:300])
        if field is not None:
            assert answer.json()["error"]["field"] == field
    assert http.put("/v1/secrets/st-x", content=b"{not json").status_code == 400
    assert http.delete("/v1/secrets/st-never-set").status_code == 404
    assert "st-x" not in http.get("/v1/secrets").text


def test_a_node_gets_secrets_only_for_a_replica_assigned_to_it(platform, http: httpx.Client, transport: Transport,
                                                              tmp_path: Path) -> None:
    put = http.put("/v1/secrets/st-node", json={"values": {"NODE_KEY": "sesame"}, "apps": ["secret-node"]})
    assert put.status_code == 200, put.text
    try:
        view = deploy(_app(tmp_path, "secret-node", "st-node"), transport=transport, timeout_s=120)
        replica = next(r.replica_id for s in view.services if s.name == "reveal" for r in s.replicas)
        forger = read_file(platform.node_credentials("st-forger"))
        own, other = asyncio.run(_ask(platform.nats_url, forger, replica, platform.node_id))
        assert own.env == {} and "not assigned" in own.error
        assert "permissions violation" in other.lower()
    finally:
        http.delete("/v1/apps/secret-node")
        http.delete("/v1/secrets/st-node")


async def _ask(url: str, creds, replica_id: str, real_node: str) -> tuple[SecretsAnswer, str]:
    """As node ``st-forger``: its own subject, asking for another node's replica; then the real node's subject."""
    nc = await nats.connect(url, **creds.connect_options())
    try:
        asked = encoder.encode(SecretsRequest(replica_id=replica_id))
        msg = await nc.request(subjects.node_secrets("st-forger"), asked, timeout=10)
        own = msgspec.json.decode(msg.data, type=SecretsAnswer)
        try:
            await nc.request(subjects.node_secrets(real_node), asked, timeout=2)
            other = "answered"
        except Exception as exc:
            other = f"{type(exc).__name__}: {nc.last_error!r}"
        return own, other
    finally:
        await nc.close()


async def _raw(url: str, app: str, secret: str) -> tuple[bytes, bytes]:
    nc = await admin_connect(url)
    try:
        js = nc.jetstream()
        deployment = (await (await js.key_value(subjects.DEPLOYMENTS_BUCKET)).get(app)).value or b""
        stored = (await (await js.key_value(subjects.SECRETS_BUCKET)).get(secret)).value or b""
        return deployment, stored
    finally:
        await nc.close()


def test_the_cli_sets_lists_and_removes_with_values_kept_out_of_argv(platform, tmp_path: Path) -> None:
    value_file = tmp_path / "token.txt"
    value_file.write_text("from-a-file\n")
    env = {**os.environ, "EMBER_URL": platform.url, "EMBER_TOKEN": platform.token}

    def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ember.cli", "secret", *args], input=stdin, capture_output=True,
                              text=True, timeout=120, env=env)

    without_apps = cli("set", "st-cli", "PLAIN_KEY=visible")
    assert without_apps.returncode == 2 and "--apps" in without_apps.stderr
    made = cli("set", "st-cli", "--apps", "cli-*,other", "--apps", "more", f"FILE_KEY=@{value_file}", "STDIN_KEY=-",
               "PLAIN_KEY=visible", stdin="from-stdin\n")
    assert made.returncode == 0, made.stderr
    assert "FILE_KEY" in made.stdout and "from-a-file" not in made.stdout and "cli-*, other, more" in made.stdout
    listed = cli("ls")
    assert "st-cli" in listed.stdout and "STDIN_KEY" in listed.stdout and "from-stdin" not in listed.stdout
    assert "cli-*, other, more" in listed.stdout
    refused = cli("set", "st-cli", "--apps", "*", "EMBER_DEVICE=cuda")
    assert refused.returncode == 1 and "EMBER_DEVICE" in refused.stderr
    assert cli("rm", "st-cli").returncode == 0
    assert "st-cli" not in cli("ls").stdout


SNAPPED = '''import os
import ember
app = ember.App("secret-snap")

@app.model(secrets=["st-snap"])
class Model:
    @ember.setup(snap=True)
    def load(self) -> None:
        self.at_snap = os.environ.get("SNAP_KEY", "<unset>")  # in the zygote: no secrets there

    @ember.method
    def reveal(self, key: str) -> list:
        return [self.at_snap, os.environ.get(key, "<unset>")]
'''


def test_a_replica_forked_from_a_zygote_gets_its_secrets_in_the_fork_request(http: httpx.Client,
                                                                            transport: Transport,
                                                                            tmp_path: Path) -> None:
    assert http.put("/v1/secrets/st-snap", json={"values": {"SNAP_KEY": "forked-value"},
                                                     "apps": ["secret-*"]}).status_code == 200
    folder = tmp_path / "secret-snap"
    folder.mkdir()
    (folder / "secret_snap.py").write_text(SNAPPED)
    try:
        view = deploy(folder / "secret_snap.py", transport=transport, timeout_s=180)
        (replica,) = [r for s in view.services for r in s.replicas]
        assert replica.start is not None and replica.start.kind == "zygote"
        assert http.post("/v1/secret-snap/Model.reveal", json="SNAP_KEY").json() == ["<unset>", "forked-value"]
    finally:
        http.delete("/v1/apps/secret-snap")
        http.delete("/v1/secrets/st-snap")
