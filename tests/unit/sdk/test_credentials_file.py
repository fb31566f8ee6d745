"""Where the SDK finds its token: ``EMBER_TOKEN``, else the file ``ember login`` writes (mode 0600), sent only to the
URL it was saved for; a credentials file that other users can read is refused, not read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ember._client import Transport
from ember._credentials import credentials_path, load_credentials, platform_token, platform_url, save_credentials
from ember._errors import UnauthenticatedError


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("EMBER_TOKEN", raising=False)
    monkeypatch.delenv("EMBER_URL", raising=False)
    return tmp_path


def test_the_file_is_saved_0600_in_a_0700_folder(home: Path) -> None:
    path = save_credentials("https://ember.example/", "ember_abc_" + "x" * 32)
    assert path == credentials_path() == home / "ember" / "credentials"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    saved = load_credentials()
    assert saved is not None and saved.url == "https://ember.example" and saved.token.startswith("ember_abc_")


def test_without_xdg_it_lives_in_the_home_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert credentials_path() == tmp_path / ".config" / "ember" / "credentials"


def test_the_saved_token_goes_only_to_its_url(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_credentials("https://ember.example", "ember_abc_" + "x" * 32)
    assert platform_url() == "https://ember.example"  # the saved URL when EMBER_URL is not set
    assert platform_token("https://ember.example/") == "ember_abc_" + "x" * 32
    assert platform_token("http://elsewhere:8700") is None
    monkeypatch.setenv("EMBER_TOKEN", "ember_env_" + "y" * 32)
    assert platform_token("http://elsewhere:8700") == "ember_env_" + "y" * 32  # EMBER_TOKEN comes first
    transport = Transport("http://elsewhere:8700")
    try:
        assert transport.token == "ember_env_" + "y" * 32
    finally:
        transport.close()


def test_a_file_others_can_read_is_refused_unread(home: Path) -> None:
    path = save_credentials("https://ember.example", "ember_abc_" + "x" * 32)
    os.chmod(path, 0o640)
    with pytest.raises(UnauthenticatedError, match="chmod 600") as caught:
        platform_token("https://ember.example")
    assert "ember_abc_" not in str(caught.value)


def test_no_file_no_token(home: Path) -> None:
    assert load_credentials() is None and platform_token("http://127.0.0.1:8700") is None
    assert platform_url() == "http://127.0.0.1:8700"
    transport = Transport()
    try:
        assert transport.token == "" and "authorization" not in transport._client.headers
    finally:
        transport.close()


def test_a_file_that_is_not_one_says_so(home: Path) -> None:
    path = credentials_path()
    path.parent.mkdir(parents=True)
    path.write_text("not json")
    path.chmod(0o600)
    with pytest.raises(UnauthenticatedError, match="ember login"):
        load_credentials()
