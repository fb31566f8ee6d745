"""Who may name stored content, as pure functions of the recorded patterns (``control.owners``): a pattern covers
a name it matches; a record covers a token only where it surely covers every name the token sees."""

from __future__ import annotations

import pytest

from ember_platform.auth.scopes import Principal
from ember_platform.control.owners import _merged, covers, covers_token, patterns_of


def _token(*apps: str, scopes: tuple[str, ...] = ("deploy", "read")) -> Principal:
    return Principal("t", frozenset(scopes), list(apps))


def test_an_upload_records_the_tokens_patterns_or_star_for_an_admin() -> None:
    assert patterns_of(_token("team-b-*", "solo")) == ["solo", "team-b-*"]
    assert patterns_of(_token("*")) == ["*"]
    assert patterns_of(_token("x", scopes=("admin",))) == ["*"]


@pytest.mark.parametrize(("patterns", "name", "expected"), [
    (["team-b-*"], "team-b-api", True),
    (["team-b-*"], "tenant-x", False),
    (["team-b-api"], "team-b-api", True),
    (["team-b-api"], "team-b-web", False),
    (["*"], "anything", True),
    ([], "team-b-api", False),  # nobody uploaded it through the API
    (["tenant-?"], "tenant-x", True),
])
def test_a_pattern_covers_the_names_it_matches(patterns: list[str], name: str, expected: bool) -> None:
    assert covers(patterns, name) is expected


@pytest.mark.parametrize(("patterns", "apps", "expected"), [
    (["team-b-*"], ["team-b-*"], True),
    (["team-b-*"], ["team-b-api"], True),
    (["team-b-*"], ["team-b-api-*"], True),
    (["team-b-*"], ["team-b-*", "tenant-*"], False),  # not every name this token sees
    (["team-b-*"], ["tenant-*"], False),
    (["team-b-api"], ["team-b-*"], False),
    (["a?"], ["a*"], False),  # 'a*' sees 'abc', which 'a?' does not match
    (["a*"], ["a?"], True),
    (["*"], ["tenant-*"], True),
    ([], ["tenant-*"], False),
])
def test_a_record_covers_a_token_only_for_every_name_it_sees(patterns: list[str], apps: list[str],
                                                            expected: bool) -> None:
    assert covers_token(patterns, _token(*apps)) is expected


def test_an_admin_sees_every_stored_object() -> None:
    assert covers_token([], _token("*", scopes=("admin",)))


def test_records_merge_and_star_covers_the_rest() -> None:
    assert _merged(["team-b-*"], ["tenant-*"]) == ["team-b-*", "tenant-*"]
    assert _merged(["team-b-*"], ["*"]) == ["*"]
    assert _merged(["a"], ["a"]) == ["a"]
