"""The README and the docs site: the README stays a short front page (at most 200 lines, the two commands and a
first app first), every relative link in it and in docs/ leads to a file and heading that exist (mkdocs --strict
checks the site's own links when it is built; GitHub shows the README and the pages without building anything),
and the generated reference pages cover every CLI command and every route."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from support.paths import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS / "hooks" / "reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _slug(heading: str) -> str:
    """A heading's anchor as mkdocs' toc and GitHub make it (lower case, punctuation dropped, spaces to dashes)."""
    heading = re.sub(r"\{[^}]*\}\s*$", "", heading).strip().lower()
    return re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", heading))


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def _links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(FENCE.sub("", page.read_text()))
            if not re.match(r"[a-z]+:", m.group(1))]


def _broken(page: Path, generated: set[Path]) -> list[str]:
    broken = []
    for link in _links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if target in generated:
            continue
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link}: no heading #{anchor} in {target.name}")
    return broken


def test_the_readme_is_a_front_page_of_at_most_200_lines() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    # What a newcomer needs first comes first: the two commands, then a first app, then where to go next.
    positions = [text.index(s) for s in ("## The two commands", "make demo", "make test", "ember.App(", "ember dev",
                                          "## Where to go next")]
    assert positions == sorted(positions)


def test_the_quick_start_shows_what_the_readme_shows() -> None:
    # docs/quickstart.md repeats the README's two commands and first app for the site: the same commands and code.
    readme, quickstart = README.read_text(), (DOCS / "quickstart.md").read_text()
    top = readme[readme.index("## The two commands"):readme.index("## Everyday commands")]
    assert [block for block in FENCE.findall(top) if block not in quickstart] == []


@pytest.mark.parametrize("page", [README, *sorted(DOCS.rglob("*.md"))], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    hooks = _hooks()
    generated = {(DOCS / hooks.CLI_PAGE).resolve(), (DOCS / hooks.OPENAPI_PAGE).resolve()}
    assert _broken(page, generated) == []


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# B\n\n```\n# not a heading\n```\n")
    (tmp_path / "a.md").write_text("# A\n\n## Two words, one: comma\n\n[x](c.md) [y](#two-words-one-comma) "
                                   "[z](#nowhere) [w](https://x.y) [v](b.md#b) [u](b.md#not-a-heading)\n")
    assert _broken(tmp_path / "a.md", set()) == [
        "c.md: no such file", "#nowhere: no heading #nowhere in a.md", "b.md#not-a-heading: no heading "
        "#not-a-heading in b.md"]


def test_every_page_of_the_site_is_in_its_navigation() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    hooks = _hooks()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")} | {hooks.CLI_PAGE, hooks.OPENAPI_PAGE}
    assert {p for p in pages if f": {p}\n" not in nav} == set()


def test_the_cli_reference_has_every_command() -> None:
    from ember.cli import build_parser

    page = _hooks().cli_markdown()
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert [c for c in commands if f"## `ember {c}`" not in page] == []
    assert "## `ember calls replay`" in page and "`--id ID`" in page  # nested verbs and their options too


def test_the_http_reference_has_every_route_of_the_openapi_document() -> None:
    hooks = _hooks()
    document = hooks.openapi_document()
    page = hooks.openapi_markdown(document)
    missing = [f"{m.upper()} {p}" for p, ms in document["paths"].items() for m in ms
               if f"### `{m.upper()} {p}`" not in page]
    assert missing == []
    assert "### `POST /v1/{app}/{name}`" in page and "### ErrorBody" in page
