"""The headless Chromium that the console's tests drive (Debian's, through Playwright)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@contextlib.contextmanager
def console_page() -> Iterator[tuple[Any, list[str]]]:
    """A page of a fresh headless Chromium, and the problems it met (script errors, Content-Security-Policy
    violations, answers of 400 and over), to be empty at the end. Skips, saying what to install, where Debian's
    chromium is not installed (`make test` installs it where it can: .ci/system-deps; CI requires it)."""
    if not Path(CHROMIUM).exists():
        pytest.skip("the console's test needs Debian's chromium: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            yield page, problems
        finally:
            browser.close()
