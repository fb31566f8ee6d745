"""The Open Inference Protocol's ``/infer`` against Ember's own route, for the same function, in the same run.

What is measured
    The p50 latency of one synchronous call (concurrency 1, over HTTP keep-alive) to ``arrays.norms``
    (tests/apps/arrays: row norms of a float32 array of shape (n, 4), numpy on the CPU) for two sizes of input,
    through four doors:

    * ``ember json``: ``POST /v1/arrays/norms`` with the array as JSON nested lists (the JSON frame path);
    * ``ember msgpack``: the same route, body and answer in msgpack (the msgpack frame path);
    * ``oip json``: ``POST /v2/models/arrays.norms/infer`` with JSON tensor data;
    * ``oip binary``: the same with the binary tensor extension both ways (what ``tritonclient`` sends by
      default): the tensors' bytes after the JSON header, never JSON numbers.

    Each answer is checked against numpy's own result once per door before timing.

How
    One ``EmbeddedPlatform`` (nats-server, a control plane, a node agent) in a temporary directory, the app pushed
    with its manifest read here. Rounds cycle through the doors, in a rotated order each round, ``--calls`` calls
    per door per round; the table gives each door's median over the rounds of its per-round p50, and its ratio to
    ``ember json``.

Usage
    python bench/oip.py [--rounds N] [--calls N] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import msgspec
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "tests" / "apps" / "arrays" / "arrays.py"
LENGTH = "Inference-Header-Content-Length"
MSGPACK = "application/msgpack"

Door = Callable[[httpx.Client, np.ndarray], np.ndarray]


def ember_json(http: httpx.Client, x: np.ndarray) -> np.ndarray:
    response = http.post("/v1/arrays/norms", content=msgspec.json.encode(x.tolist()),
                         headers={"content-type": "application/json"})
    response.raise_for_status()
    return np.asarray(msgspec.json.decode(response.content), dtype=np.float32)


def ember_msgpack(http: httpx.Client, x: np.ndarray) -> np.ndarray:
    response = http.post("/v1/arrays/norms", content=msgspec.msgpack.encode(x.tolist()),
                         headers={"content-type": MSGPACK, "accept": MSGPACK})
    response.raise_for_status()
    return np.asarray(msgspec.msgpack.decode(response.content), dtype=np.float32)


def oip_json(http: httpx.Client, x: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    response = http.post("/v2/models/arrays.norms/infer", content=msgspec.json.encode(body))
    response.raise_for_status()
    out = msgspec.json.decode(response.content)["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def oip_binary(http: httpx.Client, x: np.ndarray) -> np.ndarray:
    data = np.ascontiguousarray(x, dtype="<f4").tobytes()
    head = msgspec.json.encode({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                            "parameters": {"binary_data_size": len(data)}}],
                                "parameters": {"binary_data_output": True}})
    response = http.post("/v2/models/arrays.norms/infer", content=head + data, headers={LENGTH: str(len(head))})
    response.raise_for_status()
    size = int(response.headers[LENGTH])
    out = msgspec.json.decode(response.content[:size])["outputs"][0]
    return np.frombuffer(response.content[size:], dtype="<f4").reshape(out["shape"])


DOORS: dict[str, Door] = {"ember json": ember_json, "ember msgpack": ember_msgpack, "oip json": oip_json,
                          "oip binary": oip_binary}


def push(url: str, token: str) -> None:
    from ember._bundle import build_bundle
    from ember._client import Transport
    from ember._deploy import inspect_app, wait_ready
    from ember.wire import Deployment, DeployRequest, encoder

    transport = Transport(url, token=token)
    try:
        manifest = inspect_app(APP, "arrays")
        bundle = build_bundle(APP.parent)
        transport.request("PUT", f"/v1/bundles/{bundle.sha256}", content=bundle.data,
                          headers={"content-type": "application/gzip"})
        raw = transport.request("POST", "/v1/apps/arrays/deployments",
                                content=encoder.encode(DeployRequest(bundle_sha256=bundle.sha256, manifest=manifest)),
                                headers={"content-type": "application/json"}).content
        dep = msgspec.json.decode(raw, type=Deployment)
        wait_ready(transport, "arrays", dep.version, timeout_s=180, progress=lambda _m, _v: None)
    finally:
        transport.close()


def p50_ms(door: Door, http: httpx.Client, x: np.ndarray, calls: int) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        door(http, x)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def run(rounds: int, calls: int, rows: list[int]) -> None:
    from ember.dev.embedded import EmbeddedPlatform

    with tempfile.TemporaryDirectory(prefix="ember-bench-oip-") as state, EmbeddedPlatform(Path(state)) as platform:
        push(platform.url, platform.token)
        with httpx.Client(base_url=platform.url, headers={"Authorization": f"Bearer {platform.token}"},
                          timeout=60) as http:
            table = []
            for n in rows:
                x = np.random.default_rng(0).standard_normal((n, 4)).astype(np.float32)
                expected = np.linalg.norm(x, axis=1)
                for name, door in DOORS.items():
                    np.testing.assert_allclose(door(http, x), expected, rtol=1e-5, err_msg=name)
                    p50_ms(door, http, x, 5)  # warm
                results: dict[str, list[float]] = {name: [] for name in DOORS}
                names = list(DOORS)
                for r in range(rounds):
                    order = names[r % len(names):] + names[:r % len(names)]
                    for name in order:
                        results[name].append(p50_ms(DOORS[name], http, x, calls))
                base = statistics.median(results["ember json"])
                for name in names:
                    p50 = statistics.median(results[name])
                    table.append([f"({n}, 4) float32", name, f"{p50:.2f}", f"{p50 / base:.2f}"])
    print("| input | door | p50 ms | vs ember json |")
    print("| --- | --- | ---: | ---: |")
    for row in table:
        print("| " + " | ".join(row) + " |")
    print(f"\n{rounds} rounds x {calls} calls per door and size, concurrency 1; medians of per-round p50s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 30 calls")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.calls = 3, 30
    run(args.rounds, args.calls, [1, 4096])


if __name__ == "__main__":
    sys.exit(main())
