"""Subject pattern containment and overlap, checked against NATS' own matching rule on every subject short enough
to tell them apart."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ember.wire.validate import owned_subjects, subject_contains, subjects_overlap

LITERALS = ("a", "b")
# Every subject of up to four tokens of a, b and c: c is in no pattern, so it stands for "any other token".
SUBJECTS = [".".join(tokens) for n in range(1, 5) for tokens in itertools.product(("a", "b", "c"), repeat=n)]


def matches(pattern: str, subject: str) -> bool:
    """NATS' rule, written plainly: '*' is one token, a final '>' one or more."""
    p, s = pattern.split("."), subject.split(".")
    if p[-1] == ">":
        return len(s) >= len(p) and all(x in ("*", y) for x, y in zip(p[:-1], s, strict=False))
    return len(s) == len(p) and all(x in ("*", y) for x, y in zip(p, s, strict=True))


@st.composite
def patterns(draw: st.DrawFn) -> str:
    tokens = draw(st.lists(st.sampled_from((*LITERALS, "*")), min_size=1, max_size=3))
    if draw(st.booleans()):
        tokens.append(">")
    return ".".join(tokens[:3])


@given(patterns(), patterns())
def test_containment_is_what_the_subjects_say(outer: str, inner: str) -> None:
    inside = all(matches(outer, s) for s in SUBJECTS if matches(inner, s))
    assert subject_contains(outer, inner) == inside


@given(patterns(), patterns())
def test_overlap_is_a_subject_both_match(a: str, b: str) -> None:
    assert subjects_overlap(a, b) == any(matches(a, s) and matches(b, s) for s in SUBJECTS)
    assert subjects_overlap(a, b) == subjects_overlap(b, a)


@given(patterns())
def test_a_pattern_contains_and_overlaps_itself(pattern: str) -> None:
    assert subject_contains(pattern, pattern) and subjects_overlap(pattern, pattern)


@pytest.mark.parametrize(("outer", "inner", "contained"), [
    ("events.a.>", "events.a.x.*", True),
    ("events.a.>", "events.a.>", True),
    ("events.a.>", "events.a", False),
    ("events.a.>", "events.*.x", False),
    ("events.a.*", "events.a.>", False),
    ("events.*", "events.a", True),
    ("orders.>", "orders.eu.created", True),
    ("orders.>", "ordersx.y", False),
])
def test_examples(outer: str, inner: str, contained: bool) -> None:
    assert subject_contains(outer, inner) is contained


def test_an_app_owns_its_events_subjects_and_no_other_apps() -> None:
    own = owned_subjects("team-a")
    assert own == ["events.team-a", "events.team-a.>"]
    assert any(subject_contains(p, "events.team-a.images.>") for p in own)
    assert not any(subject_contains(p, s) for p in own for s in ("events.team-ab.x", "events.>", "events.*.x"))
