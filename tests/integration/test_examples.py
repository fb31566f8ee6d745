"""The examples a newcomer copies (examples/<name>/app.py), each pushed as its README says (`ember push`, the same
code as `ember dev`'s push, in its own process) to a real platform, then called through the HTTP API or the SDK,
checking what it answers.

The transformers example's image installs torch and transformers on the node: its platform's uv finds the CPU
build of torch in this machine's local folder of wheels (the folders pip is configured with), as an operator points
a node at a mirror; the other packages come from the package index this machine reaches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.auth import authed_client
from support.paths import REPO
from support.platform import TestPlatform
from support.polling import wait_for

import ember
from ember.wire.subjects import event_scope

pytestmark = pytest.mark.integration

EXAMPLES = REPO / "examples"
FINAL = {"succeeded", "failed", "cancelled", "expired"}
TORCH_WHEEL = "torch-2.13.0+cpu-*.whl"  # the version examples/transformers_config pins, its CPU build


def push(name: str, url: str, token: str, timeout_s: float = 300) -> str:
    """`ember push examples/<name>/app.py` in its own process, as a user runs it; its output."""
    done = subprocess.run([sys.executable, "-m", "ember.cli", "push", str(EXAMPLES / name / "app.py")],
                          capture_output=True, text=True, timeout=timeout_s, check=False,
                          env={**os.environ, "EMBER_URL": url, "EMBER_TOKEN": token})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def finished(http: httpx.Client, call_id: str) -> dict:
    """The record of a queued call once it has finished (asked with a long poll)."""
    def final() -> dict | None:
        record = http.get(f"/v1/calls/{call_id}", params={"wait": 5})
        if record.status_code == 404:  # an event not yet taken from its stream has no record yet
            return None
        body = record.json()
        return body if body["status"] in FINAL else None

    return wait_for(final, timeout_s=120, what=f"call {call_id} to finish")


def sse(response: httpx.Response) -> Iterator[tuple[str, object, float]]:
    """(event, data, when it arrived) for each Server-Sent Event, as it arrives."""
    event, data = "message", []
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[len("event: "):]
        elif line.startswith("data: "):
            data.append(line[len("data: "):])
        elif line == "" and data:
            yield event, json.loads("\n".join(data)), time.time()
            event, data = "message", []


# ---- streamer


@pytest.fixture(scope="module")
def streamer(platform) -> None:
    push("streamer", platform.url, platform.token)


def test_the_streamer_streams_its_tokens_one_by_one_over_http(streamer, http):
    body = {"prompt": "the cat", "max_tokens": 8, "seed": 3, "pause_s": 0.2}
    with http.stream("POST", "/v1/streamer/generate", json=body, headers={"Accept": "text/event-stream"}) as response:
        assert response.status_code == 200
        events = list(sse(response))
    assert [kind for kind, _, _ in events] == ["item"] * 8 + ["end"]
    items = [data for kind, data, _ in events if kind == "item"]
    assert [item["i"] for item in items] == list(range(8))  # type: ignore[index]
    assert all(isinstance(item["token"], str) and item["token"] for item in items)  # type: ignore[index]
    # the first token reached this client before the replica had made the last one
    assert events[0][2] < items[-1]["at"]  # type: ignore[index]


def test_the_streamer_streams_to_the_sdk_and_a_seed_gives_the_same_text(streamer, ember_url, http):
    body = {"prompt": "the cat", "max_tokens": 8, "seed": 3, "pause_s": 0.0}
    over_http = [json.loads(line)["item"]["token"] for line in
                 http.post("/v1/streamer/generate", json=body).text.splitlines()[:-1]]
    generate = ember.lookup("streamer", "generate")
    tokens = [item["token"] for item in generate.remote_gen(body)]
    assert tokens == over_http and len(tokens) == 8


# ---- pipeline


def test_the_pipeline_answers_with_what_the_function_it_calls_answered(platform, http):
    push("pipeline", platform.url, platform.token)
    response = http.post("/v1/pipeline/report", json="The quick brown fox jumps over the lazy dog. The end!")
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["words"] == 11 and report["distinct"] == 9
    assert report["most_common"][0] == ["the", 3]
    assert http.post("/v1/pipeline/words", json="A b, C!").json() == ["a", "b", "c"]


# ---- batch_queue


REVIEWS = [("r1", "great value, love it", "positive"), ("r2", "broken and awful", "negative"),
           ("r3", "it arrived", "neutral"), ("r4", "fast and nice", "positive"), ("r5", "slow refund", "negative")]


@pytest.fixture(scope="module")
def batch_queue(platform) -> None:
    push("batch_queue", platform.url, platform.token)


def test_the_batch_job_scores_queued_reviews(batch_queue, http):
    ids = {}
    for rid, text, _ in REVIEWS:
        spawned = http.post("/v1/batch-queue/score/spawn", json={"id": rid, "text": text})
        assert spawned.status_code == 202, spawned.text
        ids[rid] = spawned.json()["call_id"]
    for rid, _, label in REVIEWS:
        record = finished(http, ids[rid])
        assert record["status"] == "succeeded", record
        assert record["output"]["id"] == rid and record["output"]["label"] == label
        assert 1 <= record["output"]["batch_size"] <= 16


def test_the_batch_job_scores_a_published_event(batch_queue, http):
    published = http.post("/v1/events/events.batch-queue.reviews.shop", headers={"Idempotency-Key": "review-9"},
                          json={"id": "r9", "text": "perfect, excellent"})
    assert published.status_code == 202, published.text
    record = finished(http, f"ev-{event_scope(published.json()['stream'])}-review-9")
    assert record["status"] == "succeeded", record
    assert record["output"]["id"] == "r9" and record["output"]["label"] == "positive"
    assert record["output"]["score"] == 2


# ---- onnx_classifier


def _export(folder: Path) -> Path:
    """examples/onnx_classifier/export.py, run as its README says."""
    done = subprocess.run([sys.executable, str(EXAMPLES / "onnx_classifier" / "export.py"), str(folder)],
                          capture_output=True, text=True, timeout=120, check=True)
    return Path(done.stdout.strip())


def _sample(label: str) -> list[list[float]]:
    done = subprocess.run([sys.executable, str(EXAMPLES / "onnx_classifier" / "export.py"), "--sample", label],
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_the_onnx_classifier_reads_its_weights_from_a_volume_and_labels_pictures(platform, http, ember_cli,
                                                                                tmp_path):
    model = _export(tmp_path)
    assert model.name == "shapes.onnx" and model.stat().st_size > 0
    ember_cli("volume", "put", "shapes-onnx", str(model), url=platform.url)
    push("onnx_classifier", platform.url, platform.token)
    for label in ("vertical", "horizontal", "diagonal", "square"):
        response = http.post("/v1/onnx-classifier/Classifier.predict", json={"pixels": _sample(label)})
        assert response.status_code == 200, response.text
        assert response.json()["label"] == label and 0.25 < response.json()["confidence"] <= 1.0
    wrong = http.post("/v1/onnx-classifier/Classifier.predict", json={"pixels": [[0.0] * 8] * 3})
    assert 400 <= wrong.status_code < 500, wrong.text
    assert "pixels" in wrong.text


# ---- transformers_config


def _torch_wheels() -> Path:
    """A folder of this machine's local wheels (pip's find-links) that holds the CPU build of torch."""
    folders = f"{os.environ.get('PIP_FIND_LINKS', '')} {os.environ.get('UV_FIND_LINKS', '')}".split()
    for folder in map(Path, folders):
        if folder.is_dir() and any(folder.glob(TORCH_WHEEL)):
            return folder
    pytest.skip(f"no local {TORCH_WHEEL} (in PIP_FIND_LINKS or UV_FIND_LINKS) for the image's CPU torch")


@pytest.fixture(scope="module")
def torch_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestPlatform]:
    """A platform whose node's uv also looks in the local folder holding the CPU build of torch."""
    wheels = _torch_wheels()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("UV_FIND_LINKS", str(wheels))
        with TestPlatform(tmp_path_factory.mktemp("ember-transformers")) as running:
            yield running


@pytest.mark.timeout(900)  # the image installs torch and transformers on a shared machine
def test_the_transformers_model_is_built_from_its_config_inside_its_image(torch_node):
    pushed = push("transformers_config", torch_node.url, torch_node.token, timeout_s=800)
    assert "transformers-config v" in pushed
    with authed_client(torch_node) as http:
        answers = [http.post("/v1/transformers-config/TinyGPT.generate", json={"prompt": "Hello", "max_new_tokens": 6},
                             timeout=300) for _ in range(2)]
    for answer in answers:
        assert answer.status_code == 200, answer.text
    first, again = (answer.json() for answer in answers)
    assert len(first["tokens"]) == 6 and all(0 <= t < 256 for t in first["tokens"])
    assert first["tokens"] == again["tokens"]  # seeded weights, greedy decoding
    assert first["layers"] == 2 and first["parameters"] > 0
    assert first["transformers"] == "5.25.0"  # the image's, which this machine does not have
