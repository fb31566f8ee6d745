"""``ember ui``: the console's address carries the token in its fragment, never in a query string."""

from __future__ import annotations

import webbrowser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from ember._errors import UnauthenticatedError
from ember.cli import main
from ember.cli.ui import console_url, sign_in_page


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


def test_opening_a_browser_shows_no_token(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    monkeypatch.setenv("EMBER_TOKEN", "ember_abc_secret")
    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url) or True)
    assert main(["ui"]) == 0
    (url,) = opened
    assert "secret" not in url  # on the browser's command line, which every local user reads (ps)
    page = Path(urlsplit(url).path)
    assert url.startswith("file://") and page.parent == tmp_path / "ember"
    assert page.stat().st_mode & 0o777 == 0o600 and page.parent.stat().st_mode & 0o777 == 0o700
    assert 'url=http://127.0.0.1:8700/ui#token=ember_abc_secret"' in page.read_text()
    out = capsys.readouterr()
    assert "secret" not in out.out + out.err and "/ui" in out.out

    monkeypatch.setattr(webbrowser, "open", lambda url: False)  # no browser here
    assert main(["ui"]) == 1
    out = capsys.readouterr()
    assert "secret" not in out.out + out.err and "--print-url" in out.err


def test_the_page_is_written_anew_never_through_a_link_left_there(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.html"
    elsewhere.write_text("someone else's")
    (tmp_path / "console.html").symlink_to(elsewhere)
    page = sign_in_page('http://h:1/ui#token=a"b<c', tmp_path / "console.html")
    assert not page.is_symlink() and elsewhere.read_text() == "someone else's"
    assert 'url=http://h:1/ui#token=a&quot;b&lt;c"' in page.read_text()  # quoted: the token cannot end the tag


def test_without_a_token_it_says_how_to_get_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ui"]) == 1
    assert "ember login" in capsys.readouterr().err


def test_the_error_is_the_sdk_s() -> None:
    from argparse import Namespace

    from ember.cli import ui

    with pytest.raises(UnauthenticatedError):
        ui.run(Namespace(print_url=False))
