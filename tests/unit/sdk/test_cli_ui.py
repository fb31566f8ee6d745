"""``ember ui``: the console's address carries the token in its fragment, never in a query string."""

from __future__ import annotations

import webbrowser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from ember._errors import UnauthenticatedError
from ember.cli import main
from ember.cli.ui import console_url


@pytest.fixture(autouse=True)
def _no_saved_login(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no credentials file
    monkeypatch.setenv("EMBER_URL", "http://127.0.0.1:8700/")
    monkeypatch.delenv("EMBER_TOKEN", raising=False)


def test_the_token_goes_in_the_fragment_quoted() -> None:
    url = console_url("http://h:1/", "ember_ab_c+d/e&f=g#h")
    parts = urlsplit(url)
    assert (parts.path, parts.query) == ("/ui", "")
    assert parts.fragment.startswith("token=") and unquote(parts.fragment[6:]) == "ember_ab_c+d/e&f=g#h"
    assert "&" not in parts.fragment and "#" not in parts.fragment and "+" not in parts.fragment


def test_print_url(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EMBER_TOKEN", "ember_abc_secret")
    assert main(["ui", "--print-url"]) == 0
    assert capsys.readouterr().out.strip() == "http://127.0.0.1:8700/ui#token=ember_abc_secret"


def test_opening_a_browser_shows_no_token(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EMBER_TOKEN", "ember_abc_secret")
    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url) or True)
    assert main(["ui"]) == 0
    assert opened == ["http://127.0.0.1:8700/ui#token=ember_abc_secret"]
    out = capsys.readouterr()
    assert "secret" not in out.out + out.err and "/ui" in out.out

    monkeypatch.setattr(webbrowser, "open", lambda url: False)  # no browser here
    assert main(["ui"]) == 1
    out = capsys.readouterr()
    assert "secret" not in out.out + out.err and "--print-url" in out.err


def test_without_a_token_it_says_how_to_get_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ui"]) == 1
    assert "ember login" in capsys.readouterr().err


def test_the_error_is_the_sdk_s() -> None:
    from argparse import Namespace

    from ember.cli import ui

    with pytest.raises(UnauthenticatedError):
        ui.run(Namespace(print_url=False))
