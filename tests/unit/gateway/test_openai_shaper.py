"""The platform's cut of a language model's text (``max_tokens`` and ``stop`` whatever the model does), against the
text it must give: the first ``max_tokens`` pieces, up to the first stop string in them; streamed, no part of a stop
string ever goes out, and each piece costs its own length (the shaper keeps only what it holds back)."""

from __future__ import annotations

import random

import pytest

from ember._errors import PayloadTooLargeError
from ember_platform.gateway import openai_text
from ember_platform.gateway.openai_text import Shaper


def _expected(pieces: list[str], limit: int, stops: list[str]) -> tuple[str, str]:
    """The text so far after each piece: the first stop found in it (the one that began first, of those complete)
    ends the answer there."""
    text = ""
    for piece in pieces[:limit]:
        text += piece
        cut = min((i for stop in stops if (i := text.find(stop)) >= 0), default=-1)
        if cut >= 0:
            return text[:cut], "stop"
    return text, "length" if len(pieces) >= limit else "stop"


def _run(pieces: list[str], limit: int, stops: list[str], collect: bool) -> tuple[list[str], Shaper]:
    shaper, out = Shaper(limit, stops, collect=collect), []
    for piece in pieces:
        out.append(shaper.add(piece))
        if shaper.finish is not None:
            return out, shaper
    out.append(shaper.end())
    return out, shaper


@pytest.mark.parametrize("collect", [False, True])
def test_the_text_given_is_the_first_pieces_cut_at_the_first_stop(collect: bool) -> None:
    rng = random.Random(7)
    for _ in range(3000):
        alphabet = "ab\n"
        pieces = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(0, 12))]
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(0, 3))]
        limit = rng.randint(1, 14)
        out, shaper = _run(pieces, limit, stops, collect)
        text, finish = _expected(pieces, limit, stops)
        assert ("".join(out), shaper.finish) == (text, finish), (pieces, limit, stops)
        if collect:
            assert shaper.text == text
        sent = ""
        for part in out[:-1]:  # before the end, nothing that could begin a stop string left
            sent += part
            assert not any(stop in sent for stop in stops)


def test_a_streamed_answer_keeps_only_what_it_holds_back() -> None:
    shaper = Shaper(100_000, ["</s>"])
    for _ in range(10_000):
        assert shaper.add("x" * 1000)
        assert len(shaper.pending) <= 3 and shaper.parts == []


def test_an_answer_given_whole_past_the_collected_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_text, "MAX_COLLECTED_BYTES", 1000)
    shaper = Shaper(100, [], collect=True)
    shaper.add("é" * 400)  # 800 bytes
    with pytest.raises(PayloadTooLargeError) as refused:
        shaper.add("é" * 150)
    assert refused.value.field == "stream"
