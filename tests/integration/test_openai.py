"""OpenAI-compatible routes, end to end with OpenAI's own client: real HTTP, a real nats-server, real replicas."""

from __future__ import annotations

import base64
import concurrent.futures
import itertools
import json
import random
import struct
import threading
import time
import uuid

import httpx
import pytest
from support.auth import bearer
from support.lazy import openai
from support.paths import REPO
from support.polling import wait_for

import ember
from ember._deploy import deploy
from ember.wire import AppView

pytestmark = pytest.mark.integration
APP = REPO / "tests" / "apps" / "llm" / "llm.py"


@pytest.fixture(scope="module")
def llm(deployed) -> AppView:
    return deployed(APP)


@pytest.fixture(scope="module")
def client(platform, llm) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{platform.url}/openai/v1", api_key=platform.token, max_retries=0, timeout=60)


def _tag() -> str:
    return uuid.uuid4().hex[:10]


def test_chat_completion_with_usage(client):
    answer = client.chat.completions.create(model="echo-words",
                                            messages=[{"role": "user", "content": "hello big world"}])
    assert answer.object == "chat.completion"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == "hello big world "
    assert answer.choices[0].finish_reason == "stop"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (3, 3, 6)


def test_chat_stream_with_usage(client):
    chunks = list(client.chat.completions.create(model="echo-words", stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": "one two three four"}]))
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three four "
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4


def test_completions_stream_and_not(client):
    tag = _tag()
    whole = client.completions.create(model="forever", prompt="go", max_tokens=3, extra_body={"tag": tag})
    assert whole.object == "text_completion"
    assert whole.choices[0].text == "w0 w1 w2 " and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 3
    pieces = list(client.completions.create(model="forever", prompt="go", max_tokens=4, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == "w0 w1 w2 w3 "
    assert pieces[-1].choices[0].finish_reason == "length"


def test_a_completion_with_echo_gives_its_prompt_first(client):
    whole = client.completions.create(model="forever", prompt="go ", max_tokens=2, echo=True)
    assert whole.choices[0].text == "go w0 w1 " and whole.usage.completion_tokens == 2
    pieces = [p.choices[0].text for p in client.completions.create(model="forever", prompt="go ", max_tokens=2,
                                                                   echo=True, stream=True)]
    assert pieces[0] == "go " and "".join(pieces) == "go w0 w1 "
    assert client.completions.create(model="forever", prompt="go ", max_tokens=2).choices[0].text == "w0 w1 "


def test_max_tokens_closes_the_generator(client, http):
    """The platform cuts at max_tokens whatever the generator does, and the generator is closed."""
    tag = _tag()
    answer = client.completions.create(model="forever", prompt="go", max_tokens=5, extra_body={"tag": tag})
    assert answer.choices[0].text.split() == ["w0", "w1", "w2", "w3", "w4"]
    wait_for(lambda: tag in http.post("/v1/llm/Words.closed_tags", json={}).json(), timeout_s=30,
             what="the generator closed")


def test_stop_strings_end_the_answer(client):
    answer = client.chat.completions.create(model="echo-words", stop=["world"],
                                            messages=[{"role": "user", "content": "hello big world again"}])
    assert answer.choices[0].message.content == "hello big "
    assert answer.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model="echo-words", stop="g w", stream=True,
                                              messages=[{"role": "user", "content": "hello big world again"}])
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "hello bi"


def test_unknown_model_and_bad_key(client, platform):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.code == "model_not_found" and missing.value.body["param"] == "model"
    stranger = openai.OpenAI(base_url=f"{platform.url}/openai/v1", api_key="not-a-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.chat.completions.create(model="echo-words", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()


def test_a_path_openai_does_not_have_is_answered_in_its_error_shape(platform):
    """No route (or a model id with a newline, which starlette's ``path`` did not match): OpenAI's error body."""
    with httpx.Client(base_url=platform.url, headers=bearer(platform.token), timeout=30) as raw:
        for method, path, status in [("GET", "/openai/v1/nothing", 404), ("POST", "/openai/v2/chat/completions", 404),
                                     ("GET", "/openai/v1/models/%0Aecho-words", 404),
                                     ("PUT", "/openai/v1/models", 405)]:
            answer = raw.request(method, path)
            assert answer.status_code == status, (method, path, answer.text)
            error = answer.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"], (method, path, error)


def test_raw_sse_stream(platform, llm):
    with httpx.Client(base_url=platform.url, headers=bearer(platform.token), timeout=60) as raw, \
            raw.stream("POST", "/openai/v1/chat/completions",
                       json={"model": "echo-words", "stream": True,
                             "messages": [{"role": "user", "content": "a b"}]}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert {e["object"] for e in events} == {"chat.completion.chunk"}
    assert len({e["id"] for e in events}) == 1 and events[0]["id"].startswith("chatcmpl-")
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == "a b "
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"max_tokens": 10**9}, 422, "max_tokens"),
    ({"max_completion_tokens": 0}, 422, "max_completion_tokens"),
    ({"n": 2}, 422, "n"),
    ({"messages": [{"role": "user", "content": ["x", {"deep": [[[[1]]]]}]}]}, 422, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": {"text": "x"}}]}, 422, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 7}]}, 422, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 422, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 300}]}, 422, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]}, 422,
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 600_000}] * 2}]}, 422,
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}] * 5000}, 422, "messages"),
    ({"messages": json.loads("[" * 40 + "]" * 40)}, 422, "messages[0]"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 422, "messages[0].role"),
    ({"temperature": -1}, 422, "temperature"),
    ({"seed": 2**64}, 422, "seed"),  # an engine's 64-bit generator would raise on it (vLLM's server bounds it too)
    ({"stop": ["a", "b", "c", "d", "e"]}, 422, "stop"),
    ({"model": 7}, 422, "model"),
])
def test_hostile_bodies_get_openai_shaped_4xx(http, llm, body, status, param):
    sent = {"model": "echo-words", "messages": [{"role": "user", "content": "hi"}]} | body
    response = http.post("/openai/v1/chat/completions", json=sent)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_content_as_text_parts_or_null_reaches_the_model_as_one_string(client, http, llm):
    """OpenAI's clients may send a message's content as a list of text parts, and an assistant's message that called
    tools with null content: the model receives each content as one string (parts joined by newlines)."""
    parts = client.chat.completions.create(model="echo-words", messages=[
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
        {"role": "user", "content": [{"type": "text", "text": "one two"}, {"type": "text", "text": "three"}]}])
    assert parts.choices[0].message.content == "one two three "
    joined = http.post("/openai/v1/chat/completions", json={"model": "big-body", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]},
        {"role": "assistant", "content": None}]}).json()
    assert joined["choices"][0]["message"]["content"] == f"{len('ab' + chr(10) + 'cd' + chr(10))} "
    image = http.post("/openai/v1/chat/completions", json={"model": "echo-words", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]})
    assert image.status_code == 422 and "only text parts" in image.json()["error"]["message"]


def test_malformed_and_oversized_bodies(http, llm):
    bad = http.post("/openai/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    deep = http.post("/openai/v1/completions", content=b'{"model":"forever","prompt":"x","logit_bias":'
                     + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert 400 <= deep.status_code < 500 and "error" in deep.json()
    huge = http.post("/openai/v1/completions", json={"model": "forever", "prompt": "x" * (5 * 1024 * 1024)})
    assert huge.status_code == 413 and huge.json()["error"]["param"] == "body"


def test_a_models_own_body_limit_holds(client, http, llm):
    """A model's max_body_bytes, not the platform's default, bounds its bodies: below the default, and above it."""
    assert client.completions.create(model="small-body", prompt="x" * 3000).choices[0].text == "3000 "
    small = http.post("/openai/v1/completions", json={"model": "small-body", "prompt": "x" * 5000})
    assert small.status_code == 413 and small.json()["error"]["param"] == "body", small.text
    parts = [{"role": "user", "content": "x" * 1_000_000} for _ in range(5)]  # 5 MB: over the default of 4 MiB
    answer = client.chat.completions.create(model="big-body", messages=parts)
    assert answer.choices[0].message.content == f"{5 * 1_000_000 + 4} "  # the contents, one per line
    over = http.post("/openai/v1/chat/completions", json={"model": "big-body", "messages": parts * 2})
    assert over.status_code == 413 and over.json()["error"]["param"] == "body"


def test_models_are_scoped_by_token(http, client, platform, llm, hello):
    assert {"echo-words", "forever", "counter"} <= {m.id for m in client.models.list()}
    assert client.models.retrieve("counter").owned_by == "llm"
    made = http.post("/v1/tokens", json={"scopes": ["invoke", "read"], "apps": ["hello"], "name": f"oa-{_tag()}"})
    assert made.status_code == 201, made.text
    other = openai.OpenAI(base_url=f"{platform.url}/openai/v1", api_key=made.json()["token"], max_retries=0)
    assert not {"echo-words", "forever", "counter"} & {m.id for m in other.models.list()}
    with pytest.raises(openai.NotFoundError) as hidden:
        other.chat.completions.create(model="echo-words", messages=[{"role": "user", "content": "hi"}])
    assert hidden.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        other.models.retrieve("echo-words")
    reader = http.post("/v1/tokens", json={"scopes": ["read"], "apps": ["hello"], "name": f"or-{_tag()}"})
    assert reader.status_code == 201, reader.text
    reads = openai.OpenAI(base_url=f"{platform.url}/openai/v1", api_key=reader.json()["token"], max_retries=0)
    for name in ("echo-words", f"no-such-model-{_tag()}"):  # a model another app serves, and none: the same answer
        with pytest.raises(openai.PermissionDeniedError):
            reads.models.retrieve(name)


def test_embeddings_with_openais_client_as_floats_and_base64(client, http, llm):
    """OpenAI's client asks for base64 unless told otherwise, and decodes it: both give the model's vectors."""
    by_default = client.embeddings.create(model="word-stats", input=["a b", "hello"])
    assert [d.embedding for d in by_default.data] == [[3.0, 2.0, 1.0], [5.0, 1.0, 1.0]]
    assert [d.index for d in by_default.data] == [0, 1] and by_default.model == "word-stats"
    assert (by_default.usage.prompt_tokens, by_default.usage.total_tokens) == (3, 3)
    floats = client.embeddings.create(model="word-stats", input="one two three", encoding_format="float",
                                      dimensions=2)
    assert [d.embedding for d in floats.data] == [[13.0, 3.0]]
    raw = http.post("/openai/v1/embeddings", json={"model": "word-stats", "input": "hi", "encoding_format": "base64"})
    assert raw.status_code == 200 and raw.headers["x-ember-call-id"]
    packed = raw.json()["data"][0]["embedding"]
    assert struct.unpack("<3f", base64.b64decode(packed)) == (2.0, 1.0, 1.0)
    assert {"word-stats", "word-stats-batched"} <= {m.id for m in client.models.list()}
    counted = 'ember_requests_total{app="llm",code="200",function="Embedder.stats"'
    assert counted in http.get("/metrics").text  # counted as a call of its function


def test_a_batched_embedding_model_answers_each_request_its_own(client, llm):
    texts = [" ".join(["w"] * n) for n in range(1, 13)]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        got = list(pool.map(lambda t: client.embeddings.create(model="word-stats-batched", input=[t, "x"],
                                                               encoding_format="float"), texts))
    assert [[d.embedding for d in answer.data] for answer in got] == [
        [[float(len(t)), float(len(t.split()))], [1.0, 1.0]] for t in texts]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": []}, "input"),
    ({"input": ["x"] * 2049}, "input"),
    ({"input": ""}, "input"),
    ({"input": [1, 2, 3]}, "input[0]"),
    ({"input": [[1, 2], [3]]}, "input[0]"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": {"text": "x"}}, "input"),
])
def test_hostile_embedding_bodies_get_openai_shaped_422(http, llm, body, param):
    response = http.post("/openai/v1/embeddings", json={"model": "word-stats"} | body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    if param == "input[0]":
        assert "token ids are not taken" in error["message"]


def test_a_text_model_and_an_embedding_model_each_keep_to_their_route(client, http, llm, hello, platform):
    with pytest.raises(openai.BadRequestError) as wrong:
        client.chat.completions.create(model="word-stats", messages=[{"role": "user", "content": "hi"}])
    assert wrong.value.body["param"] == "model" and "embeddings" in wrong.value.message
    with pytest.raises(openai.BadRequestError) as other_way:
        client.embeddings.create(model="echo-words", input="hi")
    assert other_way.value.body["param"] == "model" and "generates text" in other_way.value.message
    bad = http.post("/openai/v1/embeddings", json={"model": "one-vector", "input": ["a", "b"]})
    assert bad.status_code == 500 and bad.json()["error"]["type"] == "server_error"
    assert "1 vectors for 2 texts" in bad.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-embedder", input="hi")
    made = http.post("/v1/tokens", json={"scopes": ["invoke", "read"], "apps": ["hello"], "name": f"oe-{_tag()}"})
    other = openai.OpenAI(base_url=f"{platform.url}/openai/v1", api_key=made.json()["token"], max_retries=0)
    with pytest.raises(openai.NotFoundError) as hidden:  # another tenant's token: as if it did not exist
        other.embeddings.create(model="word-stats", input="hi")
    assert hidden.value.code == "model_not_found"


def test_a_taken_model_name_is_a_409(llm, transport):
    with pytest.raises(ember.ConflictError, match="taken"):
        deploy(APP.parent / "taken.py", transport=transport, timeout_s=60)


def test_a_client_that_leaves_closes_the_generator(platform, http, llm):
    tag = _tag()
    with httpx.Client(base_url=platform.url, headers=bearer(platform.token), timeout=60) as raw, \
            raw.stream("POST", "/openai/v1/completions",
                       json={"model": "forever", "prompt": "go", "max_tokens": 30000, "stream": True,
                             "tag": tag}) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    wait_for(lambda: tag in http.post("/v1/llm/Words.closed_tags", json={}).json(), timeout_s=30,
             what="the generator closed after its client left")


def test_continuous_sequences_finish_in_order_of_their_length(client, http):
    """Three sequences share steps, each leaving the step after its last piece: none waits for a longer one. The
    longest is sent first and each next one once the one before streams its first piece, so that all three run
    together whatever the machine's load (sent at once from three threads, a busy machine could start the shortest,
    six steps of 10 ms, only after another had run a while, or let it finish before the third joined)."""
    tags = {_tag(): n for n in (200, 100, 6)}
    texts: dict[str, str] = {}

    def run(tag: str, started: threading.Event) -> None:
        stream = client.completions.create(model="counter", prompt=str(tags[tag]), max_tokens=250, stream=True,
                                           extra_body={"tag": tag})
        pieces = []
        for chunk in stream:
            pieces.extend(choice.text for choice in chunk.choices)
            started.set()
        texts[tag] = "".join(pieces)

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        runs = []
        for tag in tags:  # the longest first: each next one joins while those before it run
            started = threading.Event()
            runs.append(pool.submit(run, tag, started))
            assert started.wait(60), f"no piece of sequence {tags[tag]}"
        for done in runs:
            done.result()
    for tag, n in tags.items():
        assert texts[tag] == "".join(f"t{i} " for i in range(n))
    history = http.post("/v1/llm/Counter.history", json={}).json()
    steps = history["steps"]
    ran = {tag: [i for i, step in enumerate(steps) if tag in step] for tag in tags}
    first_seen: dict[str, int] = {}
    for i, step in enumerate(steps):
        for tag in step:
            first_seen.setdefault(tag, i)
    joining = {i for i, step in enumerate(steps) if step and all(first_seen[t] == i for t in step)}  # a prefill alone
    for tag, n in tags.items():  # n steps with a piece, then the one that found it done; out only for a prefill
        assert len(ran[tag]) == n + 1, (n, ran[tag])
        assert set(range(ran[tag][0], ran[tag][-1] + 1)) - set(ran[tag]) <= joining, (n, ran[tag])
    finished = [t for t in history["finished"] if t in tags]
    assert finished == sorted(tags, key=lambda tag: ran[tag][-1])
    assert finished == sorted(tags, key=tags.get), ran  # the shortest leaves first, though it came last
    together = max(len(set(step) & set(tags)) for step in history["steps"])
    assert together == 3  # the three ran in the same steps: one batch, each leaving when done


def test_a_sequence_that_joins_running_ones_takes_its_first_step_alone(platform, http, client):
    """Its prefill goes first: the new caller's first piece does not wait for a decode of the running sequences."""
    running, joining = _tag(), _tag()
    with httpx.Client(base_url=platform.url, headers=bearer(platform.token), timeout=60) as raw, \
            raw.stream("POST", "/openai/v1/completions",
                       json={"model": "counter", "prompt": "60", "max_tokens": 100, "stream": True,
                             "tag": running}) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # it runs
        answer = client.completions.create(model="counter", prompt="3", max_tokens=10, extra_body={"tag": joining})
        assert answer.choices[0].text == "t0 t1 t2 "
        assert "".join(lines).count('"text"') > 3  # the running one went on meanwhile
    steps = http.post("/v1/llm/Counter.history", json={}).json()["steps"]
    mine = [[t for t in step if t in (running, joining)] for step in steps]
    with_joining = [step for step in mine if joining in step]
    assert with_joining[0] == [joining], with_joining[:3]  # its first step, alone
    assert [running, joining] in with_joining[1:] or [joining, running] in with_joining[1:]  # then with the other


FLOOD = 8  # callers of one-piece requests, each at its own pace: new sequences come during every step


def test_new_sequences_cannot_hold_the_running_ones_back(platform, http, client):
    """Short requests arriving all the time, with slots free for them: the running sequence still steps at least every
    other step (new ones' prefill goes first, never twice in a row)."""
    running = _tag()  # 120 pieces, at least 1.2 s: long enough for the flood to reach it on a loaded machine
    stop = threading.Event()

    def flood(seed: int) -> int:
        pace, sent = random.Random(seed), 0
        while not stop.is_set():
            client.completions.create(model="wide-counter", prompt="5", max_tokens=1, extra_body={"tag": "flood"})
            sent += 1
            time.sleep(pace.uniform(0.0, 0.01))  # out of step with the others
        return sent

    with httpx.Client(base_url=platform.url, headers=bearer(platform.token), timeout=60) as raw, \
            raw.stream("POST", "/openai/v1/completions",
                       json={"model": "wide-counter", "prompt": "120", "max_tokens": 150, "stream": True,
                             "tag": running}) as response, \
            concurrent.futures.ThreadPoolExecutor(FLOOD) as pool:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # it runs
        floods = [pool.submit(flood, i) for i in range(FLOOD)]
        text = "".join(lines)  # read to its end while the flood goes on
        stop.set()
        assert sum(f.result() for f in floods) > 10
    assert text.count('"text"') >= 119 and "[DONE]" in text
    steps = http.post("/v1/llm/WideCounter.history", json={}).json()["steps"]
    mine = [i for i, step in enumerate(steps) if running in step]
    gaps = [b - a for a, b in itertools.pairwise(mine)]
    flooded = sum("flood" in step for step in steps[mine[0]:mine[-1]])
    assert flooded > 10 and max(gaps) <= 2, (flooded, gaps)


def test_continuous_max_tokens_and_stream(client):
    chunks = list(client.completions.create(model="counter", prompt="50", max_tokens=4, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "t0 t1 t2 t3 "
    assert chunks[-1].choices[0].finish_reason == "length"
    chat = client.chat.completions.create(model="counter", messages=[{"role": "user", "content": "3"}])
    assert chat.choices[0].message.content == "t0 t1 t2 " and chat.choices[0].finish_reason == "stop"


def test_a_cancelled_sequence_frees_its_slot(platform, http, client):
    tag = _tag()
    with httpx.Client(base_url=platform.url, headers=bearer(platform.token), timeout=60) as raw, \
            raw.stream("POST", "/openai/v1/completions",
                       json={"model": "counter", "prompt": "5000", "max_tokens": 6000, "stream": True,
                             "tag": tag}) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))

    def left() -> dict | None:  # a step run after the close does not have it
        client.completions.create(model="counter", prompt="1", max_tokens=2)
        history = http.post("/v1/llm/Counter.history", json={}).json()
        return history if tag not in history["steps"][-1] else None

    history = wait_for(left, timeout_s=30, what="the sequence left")
    ran = sum(tag in step for step in history["steps"])
    assert 0 < ran < 5000 and tag not in history["finished"]  # it left early, not by ending
    # Its slot is free: four new sequences (max_seqs=4) run together.
    others = [_tag() for _ in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda t: client.completions.create(model="counter", prompt="20", extra_body={"tag": t},
                                                          max_tokens=30), others))
    steps = http.post("/v1/llm/Counter.history", json={}).json()["steps"]
    assert max(len(set(step) & set(others)) for step in steps) == 4


def test_tiny_gpt_example_streams_the_same_text_alone_and_together(deployed, platform, client):
    """examples/tiny_gpt: a torch decoder under Continuous, as OpenAI's client calls it."""
    deployed(REPO / "examples" / "tiny_gpt" / "app.py")
    prompts = ["Hello", "Once upon a time", "Ember"]

    def text(prompt: str) -> str:
        chunks = client.completions.create(model="tiny-gpt", prompt=prompt, max_tokens=12, stream=True)
        return "".join(c.choices[0].text for c in chunks)

    alone = [text(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        together = list(pool.map(text, prompts))
    assert together == alone and all(len(t) == 12 for t in alone)


def test_fields_openai_allows_as_null_take_their_defaults(http, llm):
    chat = http.post("/openai/v1/chat/completions", json={
        "model": "echo-words", "messages": [{"role": "user", "content": "null is fine"}], "stream": None, "n": None})
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"].split() == ["null", "is", "fine"]
    done = http.post("/openai/v1/completions", json={"model": "forever", "prompt": "go", "max_tokens": 2,
                                                     "echo": None, "stream": None})
    assert done.status_code == 200 and done.json()["choices"][0]["text"] == "w0 w1 ", done.text
    many = http.post("/openai/v1/chat/completions", json={
        "model": "echo-words", "messages": [{"role": "user", "content": "x"}], "n": 2})
    assert many.status_code == 422 and many.json()["error"]["param"] == "n", many.text  # a value, not null: checked


def test_a_model_a_canary_adds_is_served_by_the_canary_alone(platform, http, client, transport, tmp_path):
    """A canary that adds a model takes every call to it (the version it shares the traffic with has none), and a
    caller without a token learns nothing of the app while it rolls out."""
    app = tmp_path / "canarymodel.py"
    base = "import ember\nfrom collections.abc import Iterator\n\napp = ember.App('canary-model')\n\n\n" \
           "@app.function()\ndef plain(x: int) -> int:\n    return x\n"
    app.write_text(base)
    deploy(app, transport=transport, timeout_s=180)
    try:
        app.write_text(base + "\n\n@app.function(openai='canary-words')\n"
                              "def words(req: ember.openai.ChatRequest) -> Iterator[str]:\n"
                              "    yield from (w + ' ' for w in req.messages[-1].content.split())\n")
        deploy(app, transport=transport, timeout_s=180, canary_percent=10)
        for _ in range(8):  # the split gives the version without the model 90% of the calls
            answer = client.chat.completions.create(model="canary-words",
                                                    messages=[{"role": "user", "content": "from the canary"}])
            assert answer.choices[0].message.content.split() == ["from", "the", "canary"]
        assert "canary-words" in [m.id for m in client.models.list().data]
        for _ in range(8):
            stranger = httpx.get(f"{platform.url}/openai/v1/models/canary-words", timeout=30)
            assert stranger.status_code == 401 and "canary-model" not in stranger.text, stranger.text
    finally:
        http.delete("/v1/apps/canary-model")


def test_a_canary_that_changes_a_models_function_takes_its_share_alone(http, client, transport, tmp_path):
    """The canary serves the same model from a function that changed (another ``max_concurrency``): the stable version
    keeps its share of the model's calls (the canary took every one when the two functions differed)."""
    app = tmp_path / "canaryshare.py"
    source = ("import ember\nfrom collections.abc import Iterator\n\napp = ember.App('canary-share')\n\n\n"
              "@app.function(openai='canary-share', max_concurrency={n})\n"
              "def words(req: ember.openai.ChatRequest) -> Iterator[str]:\n    yield 'v{v}'\n")
    app.write_text(source.format(n=4, v=1))
    deploy(app, transport=transport, timeout_s=180)
    try:
        app.write_text(source.format(n=8, v=2))
        deploy(app, transport=transport, timeout_s=180, canary_percent=10)
        said = [client.chat.completions.create(model="canary-share", messages=[{"role": "user", "content": "x"}])
                .choices[0].message.content for _ in range(20)]
        assert set(said) <= {"v1", "v2"} and said.count("v1") >= 10, said  # 18 of 20 on average
    finally:
        http.delete("/v1/apps/canary-share")
