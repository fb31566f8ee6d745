"""The console's static files keep to its Content-Security-Policy and put what the API says on the page as text."""

from __future__ import annotations

import re

from ember_platform.console import routes

HTML = routes.FILES["index.html"][0].decode()
JS = routes.FILES["console.js"][0].decode()


def test_the_files_served_are_the_static_ones_by_exact_name() -> None:
    assert set(routes.FILES) == {"index.html", "console.js", "console.css", "favicon.svg"}
    assert {ctype for _, ctype in routes.FILES.values()} == {"text/html; charset=utf-8",
                                                             "text/javascript; charset=utf-8",
                                                             "text/css; charset=utf-8", "image/svg+xml"}


def test_the_page_has_no_inline_script_handler_or_style() -> None:
    assert all("src=" in tag for tag in re.findall(r"<script[^>]*>", HTML))
    assert not re.search(r"\son[a-z]+\s*=", HTML)
    assert " style=" not in HTML and "<style" not in HTML
    assert not re.search(r"(src|href)=\"(https?:)?//", HTML)  # nothing from another origin


def test_the_script_never_parses_data_as_html_or_code() -> None:
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "setTimeout(\"", "setInterval(\""):
        assert sink not in JS, sink


def test_the_token_stays_in_the_session_and_off_the_url() -> None:
    assert "localStorage" not in JS and "sessionStorage" in JS
    assert "history.replaceState" in JS and "location.hash" in JS
    assert "location.search" not in JS  # a token is never read from a query string
    assert "credentials: \"omit\"" in JS  # no cookies are sent: the token is the only credential


def test_the_policy_allows_only_this_origin() -> None:
    csp = routes.HEADERS["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp and "*" not in csp
