"""A replica's answers over a real nats-server: however large a turn's answers, every call gets one answer that fits
a NATS message (a frame is cut by encoded bytes, not characters), and other inboxes' answers of that turn go too."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.nats_cluster import NatsCluster
from support.natsconn import connect

from ember import _loop as ember_loop
from ember._errors import RemoteError
from ember.wire import Answer, answers_decoder, natsflush, packed_answers_decoder
from ember_runtime.replica.answers import Answers, answer_of

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory):
    with NatsCluster(tmp_path_factory.mktemp("nats"), size=1) as cluster:
        yield cluster.url


@pytest.fixture(scope="module")
def max_payload(nats_url: str) -> int:
    """The server's limit on a message (Ember's servers allow more than NATS's 1 MiB)."""
    async def ask() -> int:
        nc = await connect(nats_url)
        try:
            return int(nc.max_payload)
        finally:
            await nc.close()

    return ember_loop.run(ask())


def _send(nats_url: str, turn: list[tuple[str, Answer]], packed: bool = False) -> dict[str, list[list[Answer]]]:
    """Answer ``turn`` (inbox, answer) in one loop turn; the frames each inbox got."""
    decoder = packed_answers_decoder if packed else answers_decoder

    async def scenario() -> dict[str, list[list[Answer]]]:
        nc, gateway = await connect(nats_url), await connect(nats_url)
        got: dict[str, list[list[Answer]]] = {}
        expected = len(turn)
        done = asyncio.Event()

        async def on_frame(msg: Any) -> None:
            got.setdefault(msg.subject, []).append(decoder.decode(msg.data))
            if sum(len(f) for frames in got.values() for f in frames) == expected:
                done.set()

        try:
            await gateway.subscribe("_INBOX.>", cb=on_frame)
            await natsflush.flush(gateway)
            answers = Answers(nc, "r1")
            for inbox, answer in turn:
                answers.answer(inbox, answer, packed)
            await answers.drain()
            await asyncio.wait_for(done.wait(), 10)
            return got
        finally:
            await nc.close()
            await gateway.close()

    return ember_loop.run(scenario())


@pytest.mark.parametrize("packed", [False, True])
def test_a_turn_of_errors_larger_in_bytes_than_in_characters_reaches_every_inbox(nats_url, max_payload, packed):
    message = "入力を処理できません: " + "あ" * 20_000  # 20,000 characters, 60,000 bytes of UTF-8
    count = max_payload // 40_000  # more than a message holds in bytes, half that in characters
    turn = [("_INBOX.gw1", answer_of(f"c{i}", None, RemoteError(message, remote_type="ValueError"), count))
            for i in range(count)]
    turn.append(("_INBOX.gw2", answer_of("other", 42, None, 1, "msgpack" if packed else "json")))
    got = _send(nats_url, turn, packed)
    gw1 = [a for frame in got["_INBOX.gw1"] for a in frame]
    assert [a.call_id for a in gw1] == [f"c{i}" for i in range(count)] and len(got["_INBOX.gw1"]) > 1
    assert all(a.error is not None and a.error.message == message for a in gw1)
    assert [a.call_id for frame in got["_INBOX.gw2"] for a in frame] == ["other"]


def test_an_answer_too_large_alone_is_answered_with_an_error_and_its_frame_goes(nats_url, max_payload):
    huge = answer_of("huge", "x" * max_payload, None, 3)
    got = _send(nats_url, [("_INBOX.gw1", answer_of("small", 1, None, 3)), ("_INBOX.gw1", huge),
                           ("_INBOX.gw1", answer_of("after", 2, None, 3))])
    answers = {a.call_id: a for frame in got["_INBOX.gw1"] for a in frame}
    assert set(answers) == {"small", "huge", "after"}
    assert bytes(answers["small"].output) == b"1" and bytes(answers["after"].output) == b"2"
    error = answers["huge"].error
    assert error is not None and error.type == "ValueError" and "limit of a NATS message" in error.message


def test_an_error_message_is_cut_at_a_sane_size_and_says_so():
    info = answer_of("c1", None, RemoteError("é" * (64 << 10)), 1).error  # 128 KiB of UTF-8
    assert info is not None and "[cut: 131072 bytes in all]" in info.message
    assert len(info.message.encode()) < (64 << 10) + 64
    short = answer_of("c2", None, RemoteError("Traceback: short"), 1).error
    assert short is not None and short.message == "Traceback: short"
