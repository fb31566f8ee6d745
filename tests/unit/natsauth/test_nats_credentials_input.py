"""Hostile input at the NATS auth entry points: credentials files and variables, and what reaches the auth
callout's subject (anyone may try to publish there; only a server's signed request is answered)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import nkeys
import pytest

from ember.wire.natscreds import (
    CREDS_ENV,
    CredentialsError,
    NatsCredentials,
    decode,
    read_file,
    take_from_env,
    write_file,
)
from ember_platform.natsauth import jwt, keys
from ember_platform.natsauth.callout import AuthCallout


def test_a_credentials_file_others_can_read_is_refused(tmp_path: Path):
    path = write_file(tmp_path / "node.creds", NatsCredentials(user="node.n1", password="secret"))
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert read_file(path).password == "secret"
    path.chmod(0o644)
    with pytest.raises(CredentialsError, match="chmod 600"):
        read_file(path)
    with pytest.raises(CredentialsError, match="cannot read"):
        read_file(tmp_path / "missing.creds")


@pytest.mark.parametrize("data", [b"", b"not json", b"[]", b'{"user": 5}', b'{"user": "x", "password": []}'])
def test_malformed_credentials_are_a_clear_error(data: bytes):
    with pytest.raises(CredentialsError):
        decode(data)


def test_credentials_never_show_their_secret_and_leave_the_environment(monkeypatch: pytest.MonkeyPatch):
    creds = NatsCredentials(user="replica.n1.r1", password="hunter2", nkey_seed="SUSEED")
    assert "hunter2" not in repr(creds) and "SUSEED" not in str(creds)
    monkeypatch.setenv(CREDS_ENV, creds.encode().decode())
    assert take_from_env() == creds
    assert CREDS_ENV not in os.environ  # nothing the replica starts, nor the app's code, finds them there


class _Msg:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.answers: list[bytes] = []

    async def respond(self, data: bytes) -> None:
        self.answers.append(data)


class _Mirror:
    items: dict = {}


def _request(signer: nkeys.KeyPair, server_id: str, user: str, password: str) -> bytes:
    claims = {"sub": "x", "nats": {"server_id": {"id": server_id}, "user_nkey": "UABC",
                                   "connect_opts": {"user": user, "pass": password}}}
    return jwt.encode(claims, signer).encode()


def test_the_callout_answers_only_a_servers_signed_request():
    auth = keys.generate()
    callout = AuthCallout(nc=None, keys=auth, assignments=_Mirror(), deployments=_Mirror())  # type: ignore[arg-type]
    node = auth.node_credentials("n1")
    server = jwt.new_key(nkeys.PREFIX_BYTE_SERVER)
    impostor = jwt.new_key(nkeys.PREFIX_BYTE_SERVER)
    hostile = [b"", b"not a jwt", b"a.b.c", b"\xff\xfe",
               # signed by another key than the server it names: a client cannot mint itself an answer
               _request(impostor, server.public_key.decode(), node.user, node.password)]
    for data in hostile:
        msg = _Msg(data)
        asyncio.run(callout._on_request(msg))  # type: ignore[arg-type]
        assert msg.answers == [], data
    real = _Msg(_request(server, server.public_key.decode(), node.user, node.password))
    asyncio.run(callout._on_request(real))  # type: ignore[arg-type]
    (answer,) = real.answers
    assert jwt.decode(answer.decode())["nats"]["jwt"]  # admitted, with a user JWT
    wrong = _Msg(_request(server, server.public_key.decode(), node.user, "guess"))
    asyncio.run(callout._on_request(wrong))  # type: ignore[arg-type]
    assert jwt.decode(wrong.answers[0].decode())["nats"]["error"] == "wrong password"
