"""OpenAI-compatible requests whose client leaves early, end to end: a non-streamed answer's client that times out
closes its generator (or ends its sequence) as a streamed one's does, and so does a client that leaves before any
replica has accepted the call (the replica accepts it later: it is told to cancel it). Each model here would run
past its client's patience, and the generators past their 60 s deadline; the waits below are shorter than that."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.lazy import openai
from support.paths import REPO
from support.polling import wait_for

from ember._deploy import app_view
from ember.wire import AppView

pytestmark = pytest.mark.integration
APP = REPO / "tests" / "apps" / "llm" / "leaving.py"


@pytest.fixture(scope="module")
def leaving(deployed) -> AppView:
    return deployed(APP)


@pytest.fixture(scope="module")
def impatient(platform, leaving) -> openai.OpenAI:
    """OpenAI's client, giving up on an answer after 1 s (and not trying again)."""
    return openai.OpenAI(base_url=f"{platform.url}/openai/v1", api_key=platform.token, max_retries=0, timeout=1)


def _tag() -> str:
    return uuid.uuid4().hex[:10]


def _closed(http: httpx.Client) -> list[str]:
    return http.post("/v1/leaving/Leaver.closed_tags", json={}).json()


def test_a_chat_answer_not_streamed_whose_client_times_out_closes_its_generator(impatient, http):
    """Without ``stream``, nothing is written until the whole answer is ready (chat's default: 4,096 pieces): the
    gateway watches the client meanwhile and closes the stream when it leaves."""
    tag = _tag()
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(model="leaving-chat", messages=[{"role": "user", "content": "go"}],
                                          extra_body={"tag": tag})
    wait_for(lambda: tag in _closed(http), timeout_s=30, what="the generator closed after its client left")


def test_a_completion_not_streamed_whose_client_times_out_ends_its_sequence(impatient, platform, http):
    tag = _tag()
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(model="leaving-steps", prompt="100000", max_tokens=30000, extra_body={"tag": tag})
    patient = openai.OpenAI(base_url=f"{platform.url}/openai/v1", api_key=platform.token, max_retries=0, timeout=60)

    def left() -> bool:  # a step run after it left does not have it (one is run here: with it alone, none would be)
        assert patient.completions.create(model="leaving-steps", prompt="1", max_tokens=2).choices[0].text == "t0 "
        return tag not in http.post("/v1/leaving/Steps.history", json={}).json()[-1]

    wait_for(left, timeout_s=30, what="the sequence left")
    assert any(tag in step for step in http.post("/v1/leaving/Steps.history", json={}).json())  # it had run


def _running(http: httpx.Client, model: str) -> float:
    """The gateway's ``vllm:num_requests_running`` of ``model``: its requests not answered or given up yet."""
    for family in text_string_to_metric_families(http.get("/metrics").text):
        if family.name == "vllm:num_requests_running":
            return sum(s.value for s in family.samples if s.labels.get("model_name") == model)
    return 0.0


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "T"


@contextlib.contextmanager
def _posted(url: str, token: str, path: str, body: bytes) -> Iterator[None]:
    """POST ``body`` to ``path`` on a connection of its own; on leaving the block, close it unanswered (a client
    that goes away)."""
    where = urlsplit(url)
    head = (f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    with socket.create_connection((where.hostname, where.port), timeout=30) as conn:
        conn.sendall(head.encode() + body)
        yield


def test_a_client_that_leaves_before_the_accept_gets_the_late_accepting_replica_to_close_it(platform, http,
                                                                                           transport, leaving):
    """The replica is stopped (SIGSTOP) while the call waits for its accept; the client leaves and the gateway gives
    the call up; then the replica goes on, takes the call and accepts it: the gateway tells it to cancel, and the
    generator is closed (before, it ran until its credit was spent and held its slot until the deadline)."""
    (replica,) = [r for s in app_view(transport, "leaving").services if s.name == "Leaver" for r in s.replicas
                  if r.state == "ready"]
    tag = _tag()
    body = json.dumps({"model": "leaving-words", "prompt": "go", "max_tokens": 30000, "stream": True, "tag": tag})
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _stopped(replica.pid), timeout_s=30, what="the replica stopped")
        with _posted(platform.url, platform.token, "/openai/v1/completions", body.encode()):
            wait_for(lambda: _running(http, "leaving-words") == 1, timeout_s=30, what="the call waiting")
        wait_for(lambda: _running(http, "leaving-words") == 0, timeout_s=30, what="the gateway giving the call up")
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    wait_for(lambda: tag in _closed(http), timeout_s=30, what="the generator closed after its late accept")
