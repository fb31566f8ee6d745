"""Push the examples and call them over HTTP, through ember.lookup and through the decorated objects."""

from __future__ import annotations

import concurrent.futures
import json
import sys
import time

import pytest
from support.auth import authed_client
from support.paths import DIGITS, REPO

import ember

pytestmark = pytest.mark.integration
SAMPLES = json.loads((DIGITS / "samples.json").read_text())


def test_push_reports_every_service_ready(hello):
    assert hello.app == "hello"
    for svc in hello.services:
        assert sum(r.state == "ready" for r in svc.replicas if r.version == hello.version) >= svc.min_replicas


def test_http_call_returns_the_json_result(hello, http):
    response = http.post("/v1/hello/greet", json="Ada")
    assert response.status_code == 200
    assert response.json() == "Hello, Ada!"
    assert len(response.headers["x-ember-call-id"]) == 32


def test_keyword_arguments_and_defaults(hello, http):
    assert http.post("/v1/hello/add", json={"a": 2, "b": 40}).json() == 42
    assert http.post("/v1/hello/add", json={"a": 2}).json() == 2


def test_struct_input(hello, http):
    assert http.post("/v1/hello/norm", json={"x": 3, "y": 4}).json() == 5.0


def test_lookup_remote_and_map(hello, ember_url):
    greet = ember.lookup("hello", "greet")
    assert greet.remote("Bob") == "Hello, Bob!"
    assert list(ember.lookup("hello", "add").map([{"a": i, "b": 1} for i in range(5)])) == [1, 2, 3, 4, 5]


def test_decorated_object_is_the_remote_handle(hello, ember_url, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples" / "hello"))
    import hello as hello_app  # the user's own module

    assert hello_app.greet.local("Cy") == "Hello, Cy!"
    assert hello_app.greet.remote("Cy") == "Hello, Cy!"
    assert hello_app.add.remote(1, b=2) == 3
    assert list(hello_app.echo.map([{"k": i} for i in range(3)])) == [{"k": 0}, {"k": 1}, {"k": 2}]
    sys.modules.pop("hello", None)


@pytest.mark.parametrize("example", ["classifier.py", "classifier_onnx.py"])
def test_digits_classifier_predicts_real_labels(example, deployed, http):
    view = deployed(DIGITS / example)
    fn = f"/v1/{view.app}/Classifier.predict"
    labels = [http.post(fn, json={"pixels": s["pixels"]}).json()["label"] for s in SAMPLES]
    assert labels == [s["label"] for s in SAMPLES]


def test_typed_results_through_the_class_handle(deployed, ember_url, monkeypatch):
    deployed(DIGITS / "classifier.py")
    monkeypatch.syspath_prepend(str(DIGITS))
    import classifier
    import schema

    prediction = classifier.Classifier.predict.remote(schema.Image(pixels=SAMPLES[0]["pixels"]))
    assert isinstance(prediction, schema.Prediction)
    assert prediction.label == SAMPLES[0]["label"]
    assert 0.0 < prediction.confidence <= 1.0
    for name in ("classifier", "schema", "model"):
        sys.modules.pop(name, None)


def test_concurrent_calls_are_batched(probe, platform):
    def call(n: int) -> tuple[int, int]:
        with authed_client(platform) as client:
            r = client.post("/v1/probe/sizes", json={"n": n})
            assert r.status_code == 200, r.text
            return r.json(), int(r.headers["x-ember-batch-size"])

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(call, range(32)))
    sizes = [size for size, _ in results]
    assert all(size == header for size, header in results)
    assert max(sizes) > 1, f"no call shared a batch: {sizes}"
    assert max(sizes) <= 16  # the function's max_size


def test_setup_runs_once_per_replica(probe, http):
    assert [http.post("/v1/probe/Counter.setups_run").json() for _ in range(3)] == [1, 1, 1]


def test_metrics_publish_each_functions_batching(probe, http):
    for n in range(3):
        assert http.post("/v1/probe/sizes", json={"n": n}).status_code == 200

    def calls_counted() -> float:
        text = http.get("/metrics").text
        prefix = 'ember_calls_total{app="probe",function="sizes"'
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    deadline = time.monotonic() + 20  # counters arrive with the replica's next heartbeat
    while calls_counted() < 3:
        assert time.monotonic() < deadline, "the calls never reached /metrics"
        time.sleep(0.2)
    text = http.get("/metrics").text
    assert "# TYPE ember_batch_size histogram" in text
    assert 'ember_batch_size_bucket{app="probe",function="sizes"' in text
    assert "ember_queue_wait_seconds_count" in text


def test_calls_are_spread_over_the_replicas(probe, platform):
    def call(_: int) -> int:
        with authed_client(platform) as client:
            return client.post("/v1/probe/whoami").json()

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        pids = list(pool.map(call, range(64)))
    counts = sorted(pids.count(pid) for pid in set(pids))
    assert len(counts) == 2, f"one replica served everything: {counts}"
    assert counts[0] >= 8  # neither replica starved
