"""Attacks on the HTTP API, against the real platform: no token, malformed ones, unknown, expired and revoked tokens,
tokens without the scope, tokens of one app naming another app's functions, logs and calls; a public endpoint that
opens nothing else; and tokens never written to the logs. Every attempt fails as specified, the normal app (hello)
keeps answering correctly, and an app a token may not see is answered exactly as an app that does not exist.

Two apps: ``gate`` (tests/apps/gate, whose ``ping`` is public), the app of the narrow tokens below, and ``hello``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.auth import bearer
from support.paths import TEST_APPS
from support.polling import wait_for

from ember.dev.embedded import EmbeddedPlatform
from ember.wire.tokens import parse_token
from ember_platform.gateway import guard
from ember_platform.gateway.asgi import ROUTES

pytestmark = pytest.mark.integration
SENT: list[str] = []  # every token these tests used: none may appear in a log


@pytest.fixture(scope="module")
def gate(deployed):
    return deployed(TEST_APPS / "gate" / "gate.py")


@pytest.fixture(scope="module")
def anon(platform: EmbeddedPlatform) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=platform.url, timeout=60) as client:
        yield client


def new_token(http: httpx.Client, scopes: list[str], apps: list[str] | None = None, ttl: str | None = None,
              name: str = "") -> str:
    body: dict[str, object] = {"scopes": scopes, "name": name or f"attack-{uuid.uuid4().hex[:6]}"}
    if apps is not None:
        body["apps"] = apps
    if ttl is not None:
        body["ttl"] = ttl
    response = http.post("/v1/tokens", json=body)
    assert response.status_code == 201, response.text
    token = response.json()["token"]
    SENT.append(token)
    return str(token)


def as_(token: str | None) -> dict[str, str]:
    return bearer(token) if token is not None else {}


def refused(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.request.method, response.request.url, response.text)
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code, error
    return dict(error)


def unauthenticated(response: httpx.Response, *, given: bool) -> dict:
    error = refused(response, 401, "unauthenticated")
    assert error["field"] == "Authorization"
    challenge = response.headers["www-authenticate"]
    assert challenge == ('Bearer error="invalid_token"' if given else "Bearer"), challenge
    return error


def hello_answers(http: httpx.Client, name: str = "Ada") -> None:
    """The normal app still answers, correctly."""
    response = http.post("/v1/hello/greet", json=name)
    assert response.status_code == 200 and response.json() == f"Hello, {name}!", response.text


def _sample_path(path: str) -> str:
    values = {"app": "hello", "name": "greet", "call_id": uuid.uuid4().hex, "sha256": "0" * 64,
              "token_id": "abc123"}
    if path.startswith("/ui/"):
        return path.replace("{name}", "console.js")  # one of the console's files (open, as the page itself)
    for key, value in values.items():
        path = path.replace("{" + key + "}", value)
    return path


def test_every_route_but_the_probes_needs_a_token(hello, anon, http):
    for route in ROUTES:
        for method in sorted(route.methods - {"HEAD"}):
            response = anon.request(method, _sample_path(route.path), content=b"{}")
            if getattr(route.endpoint, guard.NEED) == guard.OPEN:
                assert response.status_code == 200, (method, route.path)
            elif route.path.startswith("/v2"):  # the Open Inference Protocol's error shape: {"error": "<message>"}
                assert response.status_code == 401, (method, route.path, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
                assert isinstance(response.json()["error"], str)
            elif route.path.startswith("/openai/"):  # OpenAI's: {"error": {"message", "type", "param", "code"}}
                assert response.status_code == 401, (method, route.path, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
                assert response.json()["error"]["param"] == "Authorization", response.text
            else:
                unauthenticated(response, given=False)
    hello_answers(http)


@pytest.mark.parametrize("header", [
    "Bearer", "Bearer x", "Basic dXNlcjpwYXNz", "Token ember_abc_" + "x" * 32, "ember_abc_" + "x" * 32,
    "Bearer ember_abc_" + "x" * 31, "Bearer ember_ABC_" + "x" * 32, "Bearer a b", "Bearer " + "x" * 10_000,
])
def test_a_malformed_header_is_a_401(hello, anon, header):
    unauthenticated(anon.post("/v1/hello/greet", json="Ada", headers={"Authorization": header}), given=True)
    unauthenticated(anon.get("/v1/apps", headers={"Authorization": header}), given=True)


def test_an_unknown_token_or_a_wrong_secret_is_a_401(hello, http, anon, platform):
    stranger = bearer("ember_0123456789ab_" + "y" * 32)
    unknown = unauthenticated(anon.post("/v1/hello/greet", json="Ada", headers=stranger), given=True)
    token_id, secret = parse_token(platform.token) or ("", "")
    guessed = f"ember_{token_id}_{'A' if secret[0] != 'A' else 'B'}{secret[1:]}"  # the admin's id, one wrong char
    wrong = unauthenticated(anon.post("/v1/hello/greet", json="Ada", headers=bearer(guessed)), given=True)
    assert wrong == unknown  # a known id with a wrong secret tells nothing more than an unknown id
    hello_answers(http)


def test_the_scheme_is_case_insensitive(hello, anon, platform):
    response = anon.post("/v1/hello/greet", json="Ada", headers={"Authorization": f"bearer {platform.token}"})
    assert response.json() == "Hello, Ada!"


def test_an_expired_token_is_a_401(hello, http, anon):
    token = new_token(http, ["invoke"], ["hello"], ttl="2s")
    first = anon.post("/v1/hello/greet", json="Eve", headers=bearer(token))
    assert first.status_code in (200, 401)  # it may have expired already on a slow machine

    def expired() -> dict | None:
        response = anon.post("/v1/hello/greet", json="Eve", headers=bearer(token))
        return unauthenticated(response, given=True) if response.status_code == 401 else None

    error = wait_for(expired, timeout_s=30, what="the token to expire")
    assert "expired" in error["message"]
    assert token.split("_")[1] not in {t["id"] for t in http.get("/v1/tokens").json()}  # not listed once expired
    hello_answers(http)


def test_a_revoked_token_fails_at_its_next_request(hello, http, anon):
    token = new_token(http, ["invoke", "read"], ["hello"])
    token_id = token.split("_")[1]
    assert anon.post("/v1/hello/greet", json="Rev", headers=bearer(token)).json() == "Hello, Rev!"
    assert token_id in {t["id"] for t in http.get("/v1/tokens").json()}
    revoked = http.delete(f"/v1/tokens/{token_id}")
    assert revoked.status_code == 200 and revoked.json()["id"] == token_id
    unauthenticated(anon.post("/v1/hello/greet", json="Rev", headers=bearer(token)), given=True)
    unauthenticated(anon.get("/v1/apps/hello", headers=bearer(token)), given=True)
    assert token_id not in {t["id"] for t in http.get("/v1/tokens").json()}
    refused(http.delete(f"/v1/tokens/{token_id}"), 404, "not_found")  # once
    hello_answers(http)


def test_an_invoke_token_cannot_deploy_scale_delete_or_read(hello, http, anon):
    token = new_token(http, ["invoke"], ["hello"])
    auth = bearer(token)
    assert anon.post("/v1/hello/greet", json="Ivy", headers=auth).json() == "Hello, Ivy!"
    assert anon.post("/v1/hello/greet/spawn", json="Ivy", headers=auth).status_code == 202
    for method, path, body in [
        ("PUT", f"/v1/bundles/{'0' * 64}", b"x"),
        ("POST", "/v1/apps/hello/deployments", b"{}"),
        ("POST", "/v1/apps/hello/scale", b'{"service": "greet", "min_replicas": 0, "max_replicas": 1}'),
        ("DELETE", "/v1/apps/hello", None),
        ("GET", "/v1/apps", None),
        ("GET", "/v1/apps/hello", None),
        ("GET", "/v1/apps/hello/logs", None),
        ("GET", "/v1/status", None),
        ("GET", "/metrics", None),
        ("POST", "/v1/tokens", b'{"scopes": ["admin"]}'),
        ("GET", "/v1/tokens", None),
    ]:
        refused(anon.request(method, path, content=body, headers=auth), 403, "forbidden")
    assert http.get("/v1/apps/hello").status_code == 200  # nothing was deleted
    hello_answers(http)


def test_a_read_token_cannot_invoke(hello, http, anon):
    auth = bearer(new_token(http, ["read"], ["hello"]))
    assert anon.get("/v1/apps/hello", headers=auth).json()["app"] == "hello"
    refused(anon.post("/v1/hello/greet", json="Rex", headers=auth), 403, "forbidden")
    refused(anon.post("/v1/hello/greet/spawn", json="Rex", headers=auth), 403, "forbidden")
    call_id = http.post("/v1/hello/greet/spawn", json="Rex").json()["call_id"]
    refused(anon.get(f"/v1/calls/{call_id}", headers=auth), 403, "forbidden")
    refused(anon.post("/v1/apps/hello/dead/replay", json={"function": "greet"}, headers=auth), 403, "forbidden")


def test_a_deploy_token_reads_but_does_not_invoke(hello, http, anon):
    auth = bearer(new_token(http, ["deploy"], ["hello"]))
    assert anon.get("/v1/apps/hello", headers=auth).status_code == 200  # a push watches its rollout
    refused(anon.post("/v1/hello/greet", json="Dee", headers=auth), 403, "forbidden")
    refused(anon.get("/v1/tokens", headers=auth), 403, "forbidden")


def test_an_apps_token_sees_nothing_of_another_app(hello, gate, http, anon):
    """A token of ``gate`` naming hello's function, logs, dead letters and calls gets exactly the answers of an app
    and of a call that do not exist."""
    auth = bearer(new_token(http, ["invoke", "read"], ["gate"]))
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"  # an app that does not exist

    def same_as_missing(path: str, method: str = "GET", body: object = None) -> None:
        seen = anon.request(method, path.format(app="hello"), json=body, headers=auth)
        missing = anon.request(method, path.format(app=ghost), json=body, headers=auth)
        error = refused(seen, 404, "not_found")
        assert error == {**refused(missing, 404, "not_found"), "message": error["message"]}
        assert error["message"] == refused(missing, 404, "not_found")["message"].replace(ghost, "hello")

    same_as_missing("/v1/{app}/greet", "POST", "Ada")
    same_as_missing("/v1/{app}/greet/spawn", "POST", "Ada")
    same_as_missing("/v1/{app}/nosuchfunction", "POST", "Ada")
    same_as_missing("/v1/apps/{app}")
    same_as_missing("/v1/apps/{app}/logs")
    same_as_missing("/v1/apps/{app}/dead")
    same_as_missing("/v1/apps/{app}/dead/replay", "POST", {"function": "greet"})

    call_id = http.post("/v1/hello/greet/spawn", json="Bob").json()["call_id"]
    unknown = uuid.uuid4().hex
    for method in ("GET", "DELETE"):
        theirs = refused(anon.request(method, f"/v1/calls/{call_id}", headers=auth), 404, "not_found")
        nobodys = refused(anon.request(method, f"/v1/calls/{unknown}", headers=auth), 404, "not_found")
        assert theirs == {**nobodys, "message": nobodys["message"].replace(unknown, call_id)}
    assert http.get(f"/v1/calls/{call_id}", params={"wait": 30}).json()["status"] == "succeeded"  # not cancelled

    assert [a["app"] for a in anon.get("/v1/apps", headers=auth).json()] == ["gate"]
    status = anon.get("/v1/status", headers=auth).json()
    assert {s["app"] for s in status["services"]} == {"gate"}
    assert {r["app"] for node in status["nodes"] for r in node["replicas"]} <= {"gate"}
    refused(anon.get("/v1/status", params={"app": "hello"}, headers=auth), 404, "not_found")
    wait_for(lambda: 'app="hello"' in http.get("/metrics").text, timeout_s=30, what="hello's metrics")
    assert 'app="hello"' not in anon.get("/metrics", headers=auth).text
    paths = anon.get("/openapi.json", headers=auth).json()["paths"]
    assert "/v1/gate/ping" in paths and not any(p.startswith("/v1/hello/") for p in paths)
    assert "/v1/hello/greet" in http.get("/openapi.json").json()["paths"]  # the admin's document has it
    assert anon.post("/v1/gate/ping", json="Al", headers=auth).json() == "pong Al"
    hello_answers(http)


def test_a_pattern_token_sees_the_apps_it_matches(hello, gate, http, anon):
    auth = bearer(new_token(http, ["read"], ["h?llo", "nomatch-*"]))
    assert [a["app"] for a in anon.get("/v1/apps", headers=auth).json()] == ["hello"]
    refused(anon.get("/v1/apps/gate", headers=auth), 404, "not_found")


def test_a_public_function_needs_no_token_and_opens_nothing_else(gate, http, anon):
    assert anon.post("/v1/gate/ping", json="Pat").json() == "pong Pat"
    other = bearer(new_token(http, ["read"], ["hello"]))  # a token of another app, or a broken one, changes nothing
    assert anon.post("/v1/gate/ping", json="Pat", headers=other).json() == "pong Pat"
    assert anon.post("/v1/gate/ping", json="Pat", headers={"Authorization": "Bearer junk"}).json() == "pong Pat"
    refused(anon.post("/v1/gate/ping", json=5), 422, "invalid_input")  # still validated
    unauthenticated(anon.post("/v1/gate/ping/spawn", json="Pat"), given=False)
    unauthenticated(anon.post("/v1/gate/nosuchfunction", json="Pat"), given=False)  # no leak of what exists
    unauthenticated(anon.post("/v1/ghost-app/ping", json="Pat"), given=False)
    for path in ("/v1/apps/gate", "/v1/apps/gate/logs", "/v1/apps/gate/dead", "/v1/apps"):
        unauthenticated(anon.get(path), given=False)
    unauthenticated(anon.delete("/v1/apps/gate"), given=False)
    call_id = http.post("/v1/gate/ping/spawn", json="Pat").json()["call_id"]
    unauthenticated(anon.get(f"/v1/calls/{call_id}"), given=False)
    document = http.get("/openapi.json").json()
    assert document["paths"]["/v1/gate/ping"]["post"]["security"] == []
    assert "security" not in document["paths"]["/v1/gate/ping/spawn"]["post"]
    assert http.get("/v1/apps/gate").status_code == 200


def test_the_probes_need_no_token(anon):
    assert anon.get("/healthz").json() == {"status": "ok"}
    assert anon.get("/readyz").json() == {"status": "ready"}


def test_token_routes_validate_their_input(http, anon):
    for body, field in [({"scopes": []}, "$.scopes"), ({"scopes": ["root"]}, "$.scopes[0]"),
                        ({"scopes": ["read"], "apps": ["Not An App"]}, "$.apps[0]"),
                        ({"scopes": ["read"], "ttl": "1 week"}, "$.ttl"), ({"scopes": ["read"], "extra": 1}, "extra"),
                        ({"scopes": ["admin"], "apps": ["hello"]}, "$.apps"), ({"apps": ["*"]}, "scopes"),
                        ({"scopes": "read"}, "$.scopes")]:
        error = refused(http.post("/v1/tokens", json=body), 422, "invalid_input")
        assert field in (error["field"] or ""), (body, error)
    refused(http.post("/v1/tokens", content=b"{"), 400, "bad_request")
    refused(http.delete("/v1/tokens/NOT-AN-ID"), 400, "bad_request")
    refused(http.delete("/v1/tokens/abc"), 404, "not_found")
    listed = http.get("/v1/tokens").json()
    assert listed and all(set(t) == {"id", "name", "scopes", "apps", "created_at", "expires_at", "created_by"}
                          for t in listed)  # never a secret or its hash
    me = http.get("/v1/tokens/self").json()
    assert me["scopes"] == ["admin"] and me["name"] == "bootstrap"
    created = http.post("/v1/tokens", json={"scopes": ["read"], "name": "mine"}).json()
    SENT.append(created["token"])
    assert created["info"]["created_by"] == me["id"] and created["info"]["apps"] == ["*"]
    own = anon.get("/v1/tokens/self", headers=bearer(created["token"])).json()
    assert own == created["info"]


def test_idempotency_keys_map_to_random_call_ids_per_app(hello, gate, http):
    key = f"key-{uuid.uuid4().hex}"
    first = http.post("/v1/hello/greet/spawn", json="Kay", headers={"Idempotency-Key": key}).json()
    again = http.post("/v1/hello/greet/spawn", json="Kay", headers={"Idempotency-Key": key}).json()
    assert again["call_id"] == first["call_id"] and not again["created"]
    assert first["call_id"] not in {key, uuid.uuid5(uuid.NAMESPACE_URL, key).hex}
    other_app = http.post("/v1/gate/ping/spawn", json="Kay", headers={"Idempotency-Key": key}).json()
    assert other_app["call_id"] != first["call_id"] and other_app["created"]  # a key is per app
    refused(http.post("/v1/hello/greet/spawn", json="Other", headers={"Idempotency-Key": key}), 409, "conflict")
    refused(http.post("/v1/hello/add/spawn", json={"a": 1}, headers={"Idempotency-Key": key}), 409, "conflict")
    fresh = {http.post("/v1/hello/greet/spawn", json="Kay").json()["call_id"] for _ in range(3)}
    # Each names its app (the platform reads a call under that app's keys only), then 128 random bits.
    assert len(fresh) == 3 and all(c.startswith("hello_") and int(c.removeprefix("hello_"), 16) >= 0 and
                                   len(c) == len("hello_") + 32 for c in fresh)


def _cli(*args: str, url: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ember.cli", *args], capture_output=True, text=True, timeout=120,
                          input=stdin, env={**env, "EMBER_URL": url})


def test_the_cli_creates_lists_and_revokes_tokens_and_logs_in(hello, platform, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "EMBER_TOKEN"} | {"XDG_CONFIG_HOME": str(tmp_path)}
    admin = env | {"EMBER_TOKEN": platform.token}
    created = _cli("token", "create", "--scopes", "invoke,read", "--apps", "hello", "--ttl", "30d", "--name", "cli",
                   url=platform.url, env=admin)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    SENT.append(token)
    token_id = token.split("_")[1]
    listed = _cli("token", "ls", url=platform.url, env=admin).stdout
    assert token_id in listed and "invoke,read" in listed and token not in listed

    denied = _cli("ls", url=platform.url, env=env)  # no token at all
    assert denied.returncode == 1 and "UnauthenticatedError" in denied.stderr and "ember login" in denied.stderr
    assert len(denied.stderr.strip().splitlines()) == 1 and "Traceback" not in denied.stderr

    login = _cli("login", url=platform.url, env=env, stdin=token + "\n")
    assert login.returncode == 0, login.stderr
    saved = tmp_path / "ember" / "credentials"
    assert saved.stat().st_mode & 0o777 == 0o600 and token not in login.stdout
    called = _cli("call", "hello.greet", "--data", '"Cli"', url=platform.url, env=env)  # the saved token
    assert called.stdout.strip() == '"Hello, Cli!"', called.stderr
    forbidden = _cli("token", "ls", url=platform.url, env=env)
    assert forbidden.returncode == 1 and "ForbiddenError" in forbidden.stderr

    saved.chmod(0o644)
    exposed = _cli("ls", url=platform.url, env=env)
    assert exposed.returncode == 1 and "chmod 600" in exposed.stderr and token not in exposed.stderr
    saved.chmod(0o600)
    bad_login = _cli("login", url=platform.url, env=env, stdin="ember_nope_" + "z" * 32 + "\n")
    assert bad_login.returncode == 1 and "UnauthenticatedError" in bad_login.stderr

    revoked = _cli("token", "revoke", token_id, url=platform.url, env=admin)
    assert revoked.returncode == 0 and token_id in revoked.stdout
    after = _cli("call", "hello.greet", "--data", '"Cli"', url=platform.url, env=env)
    assert after.returncode == 1 and "UnauthenticatedError" in after.stderr
    assert _cli("call", "hello.greet", "--data", '"Adm"', url=platform.url, env=admin).returncode == 0


def test_no_auth_is_refused_off_loopback():
    proc = subprocess.run([sys.executable, "-m", "ember_platform", "--host", "0.0.0.0", "--insecure-no-auth"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--insecure-no-auth" in proc.stderr and "loopback" in proc.stderr


def test_no_token_reaches_the_logs(hello, gate, http, platform):
    """Last in this module: every token used above (and the admin's) is absent from every log file."""
    hello_answers(http, "Zed")
    tokens = [platform.token, *SENT]
    secrets = [parse_token(t)[1] for t in tokens if parse_token(t)]  # type: ignore[index]
    logs = {path.name: path.read_bytes() for path in platform.log_dir.glob("*.log")}
    assert "platform.log" in logs
    leaked = [name for name, text in logs.items() for secret in secrets if secret.encode() in text]
    assert leaked == []


def _refused_calls_of(http: httpx.Client, app: str) -> float:
    families = text_string_to_metric_families(http.get("/metrics").text)
    return sum(s.value for f in families if f.name == "ember_requests" for s in f.samples
               if s.name == "ember_requests_total" and s.labels.get("app") == app and s.labels.get("code") == "401")


def test_a_call_refused_for_its_token_is_not_counted_as_the_apps(hello, http, anon):
    """Without a token (or with another app's), a call was counted in the app's own metrics (``/metrics``,
    ``/v1/stats``: an error share of 1.0 written by anyone) before its token was checked."""
    before = _refused_calls_of(http, "hello")
    for _ in range(3):
        assert anon.post("/v1/hello/greet", json="x").status_code == 401
    assert _refused_calls_of(http, "hello") == before
