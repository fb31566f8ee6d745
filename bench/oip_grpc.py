"""The Open Inference Protocol over gRPC against the same protocol over HTTP, for the same function, in the same run.

What is measured
    Calls of ``arrays.norms`` (tests/apps/arrays: row norms of a float32 array of shape (n, 4), numpy on the CPU,
    the function bench/oip.py measures) through two doors, each with its binary tensors (what ``tritonclient``
    sends by default):

    * ``http``: ``POST /v2/models/arrays.norms/infer`` with the binary tensor extension both ways, over
      bench/http_latency.py's raw asyncio keep-alive connections (one per caller; httpx's client would be the
      bottleneck), the answer read whole and dropped (it is checked once with httpx first);
    * ``grpc``: ``inference.GRPCInferenceService/ModelInfer`` with ``raw_input_contents``, from one grpc.aio
      channel (HTTP/2: the calls share one connection), with tritonclient's messages.

    For each: the p50 latency at concurrency 1, and requests/s at concurrency 64 (a closed loop: 64 callers, each
    sending its next call when its last is answered). Each answer is checked against numpy's once per door first.

How
    One ``EmbeddedPlatform`` serving gRPC too (``grpc_port=0``) in a temporary directory, the app pushed as
    bench/oip.py pushes it. Rounds alternate the doors, in alternating order; the table gives each door's median over
    the rounds, and gRPC's ratio to HTTP. The load generator runs in this process, on the same machine: on two cores
    it takes a share of the CPU the platform would have, the same for both doors.

Usage
    python bench/oip_grpc.py [--rounds N] [--seconds S] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import httpx
import msgspec
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from http_latency import Connection  # noqa: E402  (bench/ is not a package)
from oip import LENGTH, push  # noqa: E402

Door = Callable[[np.ndarray], Awaitable[np.ndarray | None]]
CONCURRENCY = 64


class OipConnection(Connection):
    """bench/http_latency.py's keep-alive connection (a few lines of asyncio, so that the client is not what is
    measured), posting binary inference requests: their JSON header's length in the header the extension names."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, url: str, token: str,
                 header_length: int) -> None:
        super().__init__(reader, writer, url, token)
        self._head = self._head.replace(b"Content-Type: application/json\r\n",
                                        f"{LENGTH}: {header_length}\r\n".encode())


def _binary_body(x: np.ndarray) -> tuple[bytes, int]:
    data = np.ascontiguousarray(x, dtype="<f4").tobytes()
    head = msgspec.json.encode({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                            "parameters": {"binary_data_size": len(data)}}],
                                "parameters": {"binary_data_output": True}})
    return head + data, len(head)


def http_door(url: str, token: str) -> Door:
    """A caller over a connection of its own, made at its first call."""
    conns: dict[int, OipConnection] = {}  # by the length of the JSON header, which its request head names

    async def call(x: np.ndarray) -> np.ndarray | None:
        body, header_length = _binary_body(x)
        if header_length not in conns:
            parts = urlsplit(url)
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            conns[header_length] = OipConnection(reader, writer, f"{url}/v2/models/arrays.norms/infer", token,
                                                 header_length)
        status, _ = await conns[header_length].post(body)
        if status != 200:
            raise RuntimeError(f"HTTP {status}")
        return None

    return call


def checked_http(url: str, token: str, x: np.ndarray) -> np.ndarray:
    """The HTTP door's answer, read whole (the load generator reads and drops it)."""
    body, header_length = _binary_body(x)
    response = httpx.post(f"{url}/v2/models/arrays.norms/infer", content=body, timeout=60,
                          headers={LENGTH: str(header_length), "Authorization": f"Bearer {token}"})
    response.raise_for_status()
    return np.frombuffer(response.content[int(response.headers[LENGTH]):], dtype="<f4")


def grpc_door(stub: pb_grpc.GRPCInferenceServiceStub, token: str) -> Door:
    metadata = (("authorization", f"Bearer {token}"),)

    async def call(x: np.ndarray) -> np.ndarray:
        request = pb.ModelInferRequest(model_name="arrays.norms", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="x", datatype="FP32", shape=list(x.shape))],
            raw_input_contents=[np.ascontiguousarray(x, dtype="<f4").tobytes()])
        response = await stub.ModelInfer(request, metadata=metadata)
        return np.frombuffer(response.raw_output_contents[0], dtype="<f4")

    return call


async def p50_ms(door: Door, x: np.ndarray, calls: int) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        await door(x)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def rate(doors: list[Door], x: np.ndarray, seconds: float) -> float:
    done = 0
    until = time.perf_counter() + seconds

    async def caller(door: Door) -> None:
        nonlocal done
        while time.perf_counter() < until:
            await door(x)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller(door) for door in doors))
    return done / (time.perf_counter() - started)


async def measure(url: str, address: str, token: str, rows: list[int], rounds: int, calls: int,
                  seconds: float) -> list[list[str]]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        callers = {"http": [http_door(url, token) for _ in range(CONCURRENCY)],  # a connection each
                   "grpc": [grpc_door(stub, token)] * CONCURRENCY}  # one HTTP/2 connection for all
        table = []
        for n in rows:
            x = np.random.default_rng(0).standard_normal((n, 4)).astype(np.float32)
            np.testing.assert_allclose(checked_http(url, token, x), np.linalg.norm(x, axis=1), rtol=1e-5)
            np.testing.assert_allclose(await callers["grpc"][0](x), np.linalg.norm(x, axis=1), rtol=1e-5)
            for doors in callers.values():
                await rate(doors, x, 0.5)  # warm: every connection open
            results: dict[str, list[float]] = {f"{name} {what}": [] for name in callers for what in ("p50", "rps")}
            for r in range(rounds):
                for name in (["http", "grpc"] if r % 2 == 0 else ["grpc", "http"]):
                    results[f"{name} p50"].append(await p50_ms(callers[name][0], x, calls))
                    results[f"{name} rps"].append(await rate(callers[name], x, seconds))
            med = {key: statistics.median(values) for key, values in results.items()}
            table.append([f"({n}, 4) float32", "p50 ms, concurrency 1", f"{med['http p50']:.2f}",
                          f"{med['grpc p50']:.2f}", f"{med['grpc p50'] / med['http p50']:.2f}"])
            table.append([f"({n}, 4) float32", f"req/s, concurrency {CONCURRENCY}", f"{med['http rps']:,.0f}",
                          f"{med['grpc rps']:,.0f}", f"{med['grpc rps'] / med['http rps']:.2f}"])
    return table


def run(rounds: int, calls: int, seconds: float, rows: list[int]) -> None:
    from ember.dev.embedded import EmbeddedPlatform

    with tempfile.TemporaryDirectory(prefix="ember-bench-oip-grpc-") as state, \
            EmbeddedPlatform(Path(state), grpc_port=0) as platform:
        push(platform.url, platform.token)
        table = asyncio.run(measure(platform.url, platform.grpc_address, platform.token, rows, rounds, calls,
                                    seconds))
    print("| input | measure | http | grpc | grpc / http |")
    print("| --- | --- | ---: | ---: | ---: |")
    for row in table:
        print("| " + " | ".join(row) + " |")
    print(f"\n{rounds} rounds, doors alternating: {calls} calls for the p50, {seconds:g} s for req/s; round medians")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 50 calls and 1.5 s")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.calls, args.seconds = 3, 50, 1.5
    run(args.rounds, args.calls, args.seconds, [1, 4096])


if __name__ == "__main__":
    sys.exit(main())
