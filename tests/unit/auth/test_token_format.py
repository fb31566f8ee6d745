"""Tokens read ``ember_<id>_<secret>``: random (at least 128 bits), parsed strictly, stored as a hash."""

from __future__ import annotations

import hashlib
import math
import os
import stat
from pathlib import Path

import pytest

from ember.dev.embedded import admin_token
from ember.wire.tokens import new_token, parse_token, secret_digest
from ember_platform.auth.bootstrap import first_token_banner, loopback_only, read_token_file


def test_a_new_token_parses_back_and_carries_enough_randomness():
    token = new_token()
    token_id, secret = parse_token(token) or ("", "")
    assert token == f"ember_{token_id}_{secret}"
    assert len(secret) * 6 >= 128 and len(set(new_token() for _ in range(100))) == 100
    assert secret_digest(secret) == hashlib.sha256(secret.encode()).hexdigest() and secret not in secret_digest(secret)
    assert parse_token(new_token("admin"))[0] == "admin"  # type: ignore[index]


def test_the_secrets_look_random():
    # 100 secrets of 32 base64url characters: every one of the 64 characters turns up, none dominates.
    text = "".join(parse_token(new_token())[1] for _ in range(100))  # type: ignore[index]
    counts = {c: text.count(c) for c in set(text)}
    assert len(counts) == 64 and max(counts.values()) < 3 * len(text) / 64
    entropy = -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())
    assert entropy > 5.8  # bits per character, of 6


@pytest.mark.parametrize("text", ["", "ember_", "ember__" + "x" * 32, "ember_abc_" + "x" * 31, "Ember_abc_" + "x" * 32,
                                  "ember_ABC_" + "x" * 32, "ember_abc_" + "x" * 31 + "!", "ember_abc" + "x" * 32,
                                  "xember_abc_" + "x" * 32, "ember_abc_" + "x" * 129, "ember_a.b_" + "x" * 32,
                                  "ember_abc_" + "x" * 31 + "\n"])
def test_malformed_tokens_parse_to_none(text):
    assert parse_token(text) is None


def test_an_id_that_is_not_one_is_refused():
    with pytest.raises(ValueError):
        new_token("Not-An-Id")


def test_a_bootstrap_file_is_written_once_with_mode_0600_and_read_back(tmp_path: Path):
    path = tmp_path / "token"
    token = read_token_file(path)
    assert parse_token(token) is not None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_token_file(path) == token  # the same token across restarts


def test_a_bootstrap_file_others_can_read_or_without_a_token_is_refused(tmp_path: Path):
    path = tmp_path / "token"
    path.write_text(new_token())
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        read_token_file(path)
    os.chmod(path, 0o600)
    path.write_text("not a token")
    with pytest.raises(ValueError, match="does not hold an Ember token") as caught:
        read_token_file(path)
    assert "not a token" not in str(caught.value)  # a file's content is never shown


def test_the_embedded_platforms_token_file(tmp_path: Path):
    path = tmp_path / "token"
    token = admin_token(path)
    assert admin_token(path) == token and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("garbage")
    assert admin_token(path) != token and parse_token(admin_token(path)) is not None


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True),
                                                ("[::1]", True), ("localhost", True), ("0.0.0.0", False),
                                                ("::", False), ("10.0.0.1", False), ("example.com", False),
                                                ("", False)])
def test_which_addresses_are_loopback_only(host, loopback):
    assert loopback_only(host) is loopback


def test_the_first_token_banner_shows_the_token():
    assert "ember_admin_x" in first_token_banner("ember_admin_x")
