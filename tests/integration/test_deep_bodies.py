"""Deeply nested bodies. The gateway refuses any body nested deeper than 64 levels with a 400 naming the limit (on the
OpenAI routes in OpenAI's shape), before its token check even: a whole-number float for an int field beside a deep
unknown field made its fallback recurse (a plain-text 500, unauthenticated). And a replica answers every call of a frame
whatever its input (sent here by hand, as no gateway now would): a frame too deep for its decoder was dropped (the
call never accepted, a 503 after retries), and a Continuous model's input too deep for its decoder left the accepted
stream open (the client waited for its deadline)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import msgspec
import pytest
from support.natsconn import connect as admin_connect
from support.paths import REPO

from ember._client import ssl_context
from ember._deploy import app_view
from ember.wire import (
    Answer,
    Invocation,
    answers_decoder,
    encoder,
    packed_answers_decoder,
    packed_encoder,
    subjects,
)
from ember.wire.streams import StreamChunk, chunk_decoder

pytestmark = pytest.mark.integration
LIMIT = 64
TOO_DEEP = f"deeper than {LIMIT} levels"
WAIT_S = 30.0  # for an answer that must come


def nest(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _openai_bodies(depth: int) -> dict[str, bytes]:
    junk = b', "junk": ' + nest(depth) + b"}"
    return {"/openai/v1/completions": b'{"model": "counter", "prompt": "1", "max_tokens": 2.0' + junk,
            "/openai/v1/chat/completions":
                b'{"model": "echo-words", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2.0' + junk,
            "/openai/v1/embeddings": b'{"model": "word-stats", "input": "x", "dimensions": 2.0' + junk}


@pytest.fixture(scope="module")
def llm(deployed):
    return deployed(REPO / "tests" / "apps" / "llm" / "llm.py")


@pytest.mark.parametrize("depth", [600, 100_000])
def test_a_deep_openai_body_is_a_4xx_in_openais_shape_with_a_token_or_without(platform, http, llm, depth):
    with httpx.Client(base_url=platform.url, timeout=60, verify=ssl_context()) as anonymous:
        for route, body in _openai_bodies(depth).items():
            for client in (anonymous, http):
                answer = client.post(route, content=body, headers={"Content-Type": "application/json"})
                assert 400 <= answer.status_code < 500, (route, answer.status_code, answer.text[:300])
                assert answer.headers["content-type"].startswith("application/json"), answer.text[:300]
                error = answer.json()["error"]
                assert {"message", "type", "param", "code"} <= set(error), error
                if client is http:
                    assert answer.status_code == 400 and TOO_DEEP in error["message"], error


def test_an_openai_body_within_the_limit_still_takes_whole_number_floats(http, llm):
    body = _openai_bodies(LIMIT - 2)["/openai/v1/completions"].replace(b'"prompt": "1"', b'"prompt": "2"')
    answer = http.post("/openai/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == "t0 t1 ", answer.text[:300]


def test_a_call_body_is_bounded_in_json_and_msgpack(hello, http):
    within = http.post("/v1/hello/echo", content=b'{"x": ' + nest(LIMIT - 1) + b"}")
    assert within.status_code == 200 and within.json() == {"x": json.loads(nest(LIMIT - 1))}
    for body, kind in ((b'{"x": ' + nest(LIMIT) + b"}", "application/json"),
                       (b"\x81\xa1x" + b"\x91" * LIMIT + b"\x90", "application/msgpack")):
        deep = http.post("/v1/hello/echo", content=body, headers={"Content-Type": kind})
        assert deep.status_code == 400, deep.text[:300]
        assert deep.json()["error"]["code"] == "bad_request" and TOO_DEEP in deep.json()["error"]["message"]


def test_an_api_routes_body_is_bounded_too(hello, http):
    body = b'{"service": "greet", "min_replicas": 0.0, "max_replicas": 2.0, "junk": ' + nest(600) + b"}"
    answer = http.post("/v1/apps/hello/scale", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"]["code"] == "bad_request" and TOO_DEEP in answer.json()["error"]["message"]


# -- a replica, sent frames by hand -----------------------------------------------------------------------------


def _inbox(app: str) -> str:
    return f"{subjects.answers_inbox(uuid.uuid4().hex[:16])}.{app}"


async def _exchange(platform, transport, app: str, function: str, calls: list[Invocation],  # type: ignore[no-untyped-def]
                    packed: bool) -> dict[str, Answer]:
    """Send ``calls`` in one frame to the app's replicas, as a gateway would; each call's answer."""
    subject = subjects.invoke(app, function, app_view(transport, app).version)
    nc = await admin_connect(platform.nats_url)
    try:
        inbox = _inbox(app)
        got: asyncio.Queue = asyncio.Queue()
        await nc.subscribe(f"{inbox}.*", cb=got.put)
        await nc.publish(subject, (packed_encoder if packed else encoder).encode(calls), reply=f"{inbox}.1")
        answers: dict[str, Answer] = {}
        while len(answers) < len(calls):
            data = (await asyncio.wait_for(got.get(), WAIT_S)).data
            answers |= {a.call_id: a for a in (packed_answers_decoder if packed else answers_decoder).decode(data)
                        if not a.ack}
        return answers
    finally:
        await nc.close()


@pytest.mark.parametrize("packed", [False, True], ids=["json", "msgpack"])
def test_a_frame_too_deep_for_the_decoder_answers_every_call(hello, platform, transport, packed):
    encode = msgspec.msgpack.encode if packed else msgspec.json.encode
    deep = b"\x82\xa1a\x01\xa1b" + b"\x91" * 100_000 + b"\x90" if packed else \
        b'{"a": 1, "b": ' + nest(100_000) + b"}"
    calls = [Invocation(call_id="fine-1", function="add", deadline=time.time() + 30,
                        input=msgspec.Raw(encode({"a": 1, "b": 2}))),
             Invocation(call_id="deep", function="add", deadline=time.time() + 30, input=msgspec.Raw(deep)),
             Invocation(call_id="fine-2", function="add", deadline=time.time() + 30,
                        input=msgspec.Raw(encode({"a": 3, "b": 4})))]
    answers = asyncio.run(_exchange(platform, transport, "hello", "add", calls, packed))
    decode = msgspec.msgpack.decode if packed else msgspec.json.decode
    assert decode(answers["fine-1"].output) == 3 and decode(answers["fine-2"].output) == 7
    error = answers["deep"].error
    assert error is not None and error.code == "invalid_input", error


async def _stream(nc, subject: str, app: str, call_id: str, body: bytes) -> list[StreamChunk]:  # type: ignore[no-untyped-def]
    """One streamed call sent as a gateway sends it (alone in its frame): its chunks until its end or error."""
    inbox = f"{_inbox(app)}.{uuid.uuid4().hex[:16]}"
    sub = await nc.subscribe(inbox)
    try:
        call = Invocation(call_id=call_id, function="Counter.step", deadline=time.time() + 30, input=msgspec.Raw(body))
        await nc.publish(subject, encoder.encode([call]), reply=inbox)
        chunks: list[StreamChunk] = []
        while not chunks or not (chunks[-1].end or chunks[-1].error is not None):
            chunks.append(chunk_decoder.decode((await sub.next_msg(timeout=WAIT_S)).data))
        return chunks
    finally:
        await sub.unsubscribe()


def test_a_continuous_models_stream_ends_whatever_its_inputs_depth(llm, platform, transport):
    """From a depth its request decodes at, past the one its frame no longer decodes at (about 1,000 levels, less
    the replica's stack): every call ends, with its pieces or its error, never silence."""
    subject = subjects.invoke("llm", "Counter.step", app_view(transport, "llm").version)

    async def scenario() -> dict[int, list[StreamChunk]]:
        nc = await admin_connect(platform.nats_url)
        try:
            ended = {}
            for depth in [*range(900, 1010, 2), 100_000]:
                body = b'{"model": "counter", "prompt": "1", "extra": {"junk": ' + nest(depth) + b"}}"
                ended[depth] = await _stream(nc, subject, "llm", f"deep-{depth}", body)
            ended[1] = await _stream(nc, subject, "llm", "after", b'{"model": "counter", "prompt": "1"}')
            return ended
        finally:
            await nc.close()

    ended = asyncio.run(scenario())
    last = {depth: chunks[-1] for depth, chunks in ended.items()}
    assert all(c.end or (c.error is not None and c.error.code == "invalid_input") for c in last.values()), last
    assert last[100_000].error is not None and last[1].end
    assert [bytes(item) for c in ended[1] for item in c.items] == [b'"t0 "']
