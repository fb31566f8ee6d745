"""`make demo`: Ember's main job on this machine, start to finish.

Starts the embedded platform (a real nats-server with JetStream, the control plane and a node agent),
pushes the examples, calls them over HTTP and through the Python client, prints what the replicas
answered and a short latency table, and stops everything.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

import ember
from ember._client import Transport
from ember._volume import put_volume
from ember.dev.embedded import EmbeddedPlatform

HERE = Path(__file__).resolve().parent
SAMPLES = json.loads((HERE / "digits" / "samples.json").read_text())
APPS = [HERE / "hello" / "hello.py", HERE / "digits" / "classifier.py", HERE / "digits" / "classifier_onnx.py"]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="ember-demo-") as state, EmbeddedPlatform(Path(state)) as platform:
        print(f"Ember is up at {platform.url} (NATS {platform.nats_url})\n")
        auth = {"Authorization": f"Bearer {platform.token}"}  # its admin token (also in <state>/token)
        transport = Transport(platform.url, token=platform.token)
        weights = put_volume("digits-weights", [HERE / "digits" / "weights.pt"], transport=transport)
        print(f"put volume {weights.name} v{weights.version} ({weights.size:,} bytes): the digits classifier's "
              "weights, mounted at /weights")
        for app in APPS:
            started = time.monotonic()
            view = ember.deploy(app, transport=transport)
            print(f"pushed {app.relative_to(HERE.parent)} -> {view.app} v{view.version}, "
                  f"ready in {time.monotonic() - started:.1f}s")
        with httpx.Client(base_url=platform.url, timeout=60, headers=auth) as http:
            show_calls(http, transport)
            latency_table(http, platform.url)
        transport.close()
        print("\nstopping Ember...")
    print("done: every process stopped.")
    return 0


def show_calls(http: httpx.Client, transport: Transport) -> None:
    print("\nover HTTP:")
    print("  POST /v1/hello/greet \"Ada\"        ->", http.post("/v1/hello/greet", json="Ada").json())
    print("  POST /v1/hello/add {a: 2, b: 40}  ->", http.post("/v1/hello/add", json={"a": 2, "b": 40}).json())
    bad = http.post("/v1/hello/norm", json={"x": 3, "y": "four"})
    print(f"  POST /v1/hello/norm {{y: 'four'}}  -> {bad.status_code} {bad.json()['error']}")
    print("\ndigits, served by replica processes (torch and ONNX Runtime):")
    print("  true  torch (conf)    onnx (conf)")
    for sample in SAMPLES:
        body = {"pixels": sample["pixels"]}
        t = http.post("/v1/digits/Classifier.predict", json=body).json()
        o = http.post("/v1/digits-onnx/Classifier.predict", json=body).json()
        print(f"  {sample['label']:>4}  {t['label']:>5} ({t['confidence']:.3f})  "
              f"{o['label']:>4} ({o['confidence']:.3f})")
    print("\nthrough the Python client (ember.lookup(...).remote / .map):")
    greet = ember.FunctionHandle("hello", "greet", transport=transport)
    predict = ember.FunctionHandle("digits", "Classifier.predict", transport=transport)
    print("  hello.greet.remote('Grace')     ->", greet.remote("Grace"))
    labels = [p["label"] for p in predict.map({"pixels": s["pixels"]} for s in SAMPLES)]
    print("  digits predict.map(8 images)    ->", labels)


def latency_table(http: httpx.Client, url: str) -> None:
    targets = [("hello.greet", "/v1/hello/greet", "Ada"),
               ("digits.Classifier.predict", "/v1/digits/Classifier.predict", {"pixels": SAMPLES[0]["pixels"]}),
               ("digits-onnx.Classifier.predict", "/v1/digits-onnx/Classifier.predict",
                {"pixels": SAMPLES[0]["pixels"]})]
    print("\nlatency over HTTP on this machine (100 sequential calls; then 256 calls, 32 at a time):")
    print(f"  {'function':<32} {'p50 ms':>7} {'p95 ms':>7} {'burst calls/s':>14} {'mean batch':>11}")
    for name, path, body in targets:
        times = []
        for _ in range(100):
            started = time.perf_counter()
            http.post(path, json=body).raise_for_status()
            times.append((time.perf_counter() - started) * 1000)
        rate, batch = burst(url, path, body, http.headers)
        q = statistics.quantiles(times, n=100)
        print(f"  {name:<32} {q[49]:>7.2f} {q[94]:>7.2f} {rate:>14.0f} {batch:>11.1f}")


def burst(url: str, path: str, body: object, headers: httpx.Headers, calls: int = 256,
          concurrency: int = 32) -> tuple[float, float]:
    with httpx.Client(base_url=url, timeout=60, headers=headers,
                      limits=httpx.Limits(max_connections=concurrency)) as client:
        def one(_: int) -> int:
            response = client.post(path, json=body)
            response.raise_for_status()
            return int(response.headers.get("x-ember-batch-size", "1"))

        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            sizes = list(pool.map(one, range(calls)))
        elapsed = time.perf_counter() - started
    return calls / elapsed, statistics.mean(sizes)


if __name__ == "__main__":
    sys.exit(main())
