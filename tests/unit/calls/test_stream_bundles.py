"""Stream bundles: a replica's chunks for several of one gateway's streams of one app go in one message, and the
gateway hands each to its stream, dropping what names another app's stream."""

from __future__ import annotations

import asyncio

import msgspec
from nats.aio.msg import Msg

from ember.wire import encoder, subjects
from ember.wire.streams import StreamBundle, StreamChunk, bundle_decoder, chunk_decoder
from ember_platform.calls.router import Router
from ember_platform.calls.streams import Streams
from ember_runtime.replica.streams import bundled

GATEWAY = subjects.answers_inbox("gw0123")


def _chunk(call_id: str, seq: int) -> bytes:
    return encoder.encode(StreamChunk(call_id=call_id, seq=seq, items=[msgspec.Raw(b'"x"')]))


def _unbundle(message: tuple[str, bytes]) -> list[tuple[str, int]]:
    subject, data = message
    if subject.endswith(f".{subjects.STREAM_BUNDLE}"):
        b = bundle_decoder.decode(data)
        return [(t, chunk_decoder.decode(c).seq) for t, c in zip(b.tokens, b.chunks, strict=True)]
    return [(subject.rsplit(".", 1)[1], chunk_decoder.decode(data).seq)]


def test_one_message_per_gateway_and_app_each_streams_chunks_in_order():
    a, b, c = (f"{GATEWAY}.chat.{t * 16}" for t in "abc")
    other_gateway = f"{subjects.answers_inbox('gw9')}.chat.{'d' * 16}"
    other_app = f"{GATEWAY}.other.{'e' * 16}"
    batch = [(a, _chunk("a", 0), True), (b, _chunk("b", 0), True), (other_gateway, _chunk("d", 0), True),
             (a, _chunk("a", 1), True), (c, _chunk("c", 0), False), (other_app, _chunk("e", 0), True)]
    messages = bundled(batch, 1024 * 1024)
    assert [s for s, _ in messages] == [f"{GATEWAY}.chat.bundle", other_gateway, c, other_app]
    assert _unbundle(messages[0]) == [("a" * 16, 0), ("b" * 16, 0), ("a" * 16, 1)]


def test_a_bundle_stays_within_the_message_limit():
    replies = [f"{GATEWAY}.chat.{i:016x}" for i in range(50)]
    batch = [(r, _chunk(str(i), 0), True) for i, r in enumerate(replies)]
    limit = 1000
    messages = bundled(batch, limit)
    assert len(messages) > 1 and all(len(data) <= limit for _, data in messages)
    assert [t for m in messages for t, _ in _unbundle(m)] == [r.rsplit(".", 1)[1] for r in replies]


def test_a_subject_that_is_no_stream_reply_goes_alone():
    odd = ["_INBOX.abc.def", f"{GATEWAY}.chat.bundle", f"{GATEWAY}.chat", "x.y.z.w.v"]
    batch = [(s, _chunk("a", 0), True) for s in odd]
    assert [s for s, _ in bundled(batch, 4096)] == odd


def test_the_gateway_hands_each_chunk_to_its_stream_and_drops_another_apps():
    async def scenario() -> None:
        streams = Streams(None, Router(nc=None, replica_alive=lambda _: True), lambda _: True)  # type: ignore[arg-type]
        streams.inbox = GATEWAY
        mine, theirs = (streams.open(app, "f", 1, b"{}", call_id=app + "-call", deadline=1e12)
                        for app in ("chat", "victim"))
        for stream, token in ((mine, "a" * 16), (theirs, "b" * 16)):
            stream._token = token
            streams.listen(token, stream)
        forged = StreamBundle(tokens=["a" * 16, "b" * 16, "c" * 16, "a" * 16],
                              chunks=[msgspec.Raw(_chunk("chat-call", 0)), msgspec.Raw(_chunk("victim-call", 0)),
                                      msgspec.Raw(_chunk("chat-call", 5)), msgspec.Raw(b"{\"not\": \"a chunk\"}")])
        await streams._on_message(Msg(None, subject=f"{GATEWAY}.chat.bundle",  # type: ignore[arg-type]
                                      data=encoder.encode(forged)))
        assert [c.seq for c in mine._inbox] == [0]  # its own chunk; an unknown token and garbage dropped
        assert not theirs._inbox  # another app's stream: a replica of "chat" cannot speak for it

    asyncio.run(scenario())
