"""HTTP latency and throughput of Ember's invocation path, next to a bare HTTP endpoint.

What is measured
    Three targets, each at concurrency 1, 8 and 64:

    * ``bare echo``       a Starlette app served by uvicorn with the settings of Ember's gateway,
                          whose ``POST /echo`` returns the body: the floor for "Python HTTP on this
                          machine";
    * ``hello.echo``      Ember's batched echo function (examples/hello/hello.py);
    * ``digits.predict``  Ember's batched torch classifier (examples/digits/classifier.py) on real
                          inputs from examples/digits/samples.json.

    An Ember call goes HTTP -> gateway (routing, JSON-schema validation) -> NATS request/reply ->
    replica -> batcher -> user code, and back; the bare row has only the first hop.

How
    One run starts an ``EmbeddedPlatform`` (nats-server, control plane, node agent, as child processes)
    in a temporary state dir, deploys both example apps, and starts the bare endpoint as another child
    process. This process is the load generator: a closed loop of ``concurrency`` workers, each with its
    own keep-alive HTTP/1.1 connection over loopback, sending the next request as soon as the previous
    answer arrived. The client is a few lines of raw asyncio rather than httpx, so that the load
    generator spends as little as possible of this machine's CPU (which the servers share).

    Each cell has a short warm-up (discarded), then a measured window bounded both by time and by a
    request cap. Reported: requests/s, p50/p95/p99 latency, errors (answers with status >= 300), Ember's req/s and
    p50 relative to the bare endpoint at the same concurrency, and the mean of the ``X-Ember-Batch-Size``
    header (how many calls the replica's batcher ran together).

    Everything this script starts is stopped on exit, on error and on Ctrl-C / SIGTERM.

Usage
    python bench/http_latency.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ember import _loop as ember_loop  # the load generator runs on uvloop too, to take less of the machine

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
CONCURRENCIES = (1, 8, 64)
BATCH_HEADER = "x-ember-batch-size"
REQUEST_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Plan:
    warmup_s: float
    measure_s: float
    max_requests: int  # per measured window, whatever the time says


FULL = Plan(warmup_s=0.5, measure_s=3.0, max_requests=30_000)
QUICK = Plan(warmup_s=0.2, measure_s=1.0, max_requests=10_000)


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    bodies: list[bytes]  # sent round-robin
    is_ember: bool
    token: str | None = None  # sent as Authorization: Bearer; None: $EMBER_TOKEN (set once the platform runs)


@dataclass
class Cell:
    """The measurements of one target at one concurrency."""

    target: Target
    concurrency: int
    elapsed_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    errors: int = 0

    @property
    def requests(self) -> int:
        return len(self.latencies_ms)

    @property
    def rps(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s else 0.0

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile of the latencies, in ms."""
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return math.nan
        return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]

    @property
    def mean_batch(self) -> float:
        return sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else math.nan


# -- the bare baseline endpoint (runs in a child process) ------------------------------------------


def serve_echo() -> None:
    """Serve ``POST /echo`` on a free loopback port; print the port on stdout once listening."""
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def echo(request: Request) -> Response:
        return Response(await request.body(), media_type="application/json")

    serve_routes([Route("/echo", echo, methods=["POST"])])


def serve_routes(routes: list[Any]) -> None:
    """Serve ``routes`` (starlette ``Route``s) on a free loopback port, with the same uvicorn settings as Ember's
    gateway (ember_platform.__main__); print the port on stdout once listening. Runs until killed."""
    import uvicorn
    from starlette.applications import Starlette

    # IPPROTO_TCP matters: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets whose
    # ``proto`` says TCP, and accepted sockets inherit it from the listening one. With proto 0, uvicorn's
    # two writes per response (head, then body) wait ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(Starlette(routes=routes), log_level="warning", access_log=False,
                            timeout_graceful_shutdown=10)
    uvicorn.Server(config).run(sockets=[sock])


def start_echo_server() -> tuple[subprocess.Popen[bytes], str]:
    from ember._procs import die_with_parent

    proc = subprocess.Popen([sys.executable, __file__, "--serve-echo"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()  # the port; empty if the child died
    if not line.isdigit():
        stop_process(proc)
        raise RuntimeError("the bare echo server did not start")
    url = f"http://127.0.0.1:{int(line)}"
    wait_until_listening(url)
    return proc, url


def wait_until_listening(url: str, timeout_s: float = 30.0) -> None:
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((parts.hostname, parts.port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening at {url}")


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# -- the load generator ----------------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection that sends one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, url: str,
                 token: str | None = None) -> None:
        parts = urlsplit(url)
        self._reader, self._writer = reader, writer
        token = os.environ.get("EMBER_TOKEN", "") if token is None else token
        self._auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self._head = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{self._auth}"
                      "Content-Type: application/json\r\nContent-Length: ").encode()

    @classmethod
    async def open(cls, url: str, token: str | None = None) -> Connection:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        return cls(reader, writer, url, token)

    async def post(self, body: bytes) -> tuple[int, dict[str, str]]:
        """Send ``body``; return the status and the (lower-cased) headers once the whole answer is read."""
        self._writer.write(b"%s%d\r\n\r\n%s" % (self._head, len(body), body))
        head = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        headers = {}
        for line in head[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "content-length" not in headers:
            raise RuntimeError(f"expected a Content-Length answer, got headers {headers}")
        await self._reader.readexactly(int(headers["content-length"]))
        return status, headers

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


async def run_window(cell: Cell | None, conns: list[Connection], bodies: list[bytes],
                     duration_s: float, max_requests: int) -> None:
    """Every connection sends requests back to back until the window ends; record them into ``cell``."""
    deadline = time.perf_counter() + duration_s
    sent = 0

    async def worker(conn: Connection, offset: int) -> None:
        nonlocal sent
        i = offset
        while sent < max_requests and time.perf_counter() < deadline:
            sent += 1
            body = bodies[i % len(bodies)]
            i += len(conns)
            start = time.perf_counter()
            async with asyncio.timeout(REQUEST_TIMEOUT_S):  # no task per request, unlike wait_for
                status, headers = await conn.post(body)
            if cell is None:
                continue
            cell.latencies_ms.append((time.perf_counter() - start) * 1000)
            cell.errors += status >= 300
            if BATCH_HEADER in headers:
                cell.batch_sizes.append(int(headers[BATCH_HEADER]))

    start = time.perf_counter()
    await asyncio.gather(*(worker(conn, k) for k, conn in enumerate(conns)))
    if cell is not None:
        cell.elapsed_s = time.perf_counter() - start


async def measure(target: Target, concurrency: int, plan: Plan) -> Cell:
    """Warm up, then measure ``target`` with ``concurrency`` closed-loop connections."""
    conns = [await Connection.open(target.url, target.token) for _ in range(concurrency)]
    try:
        await run_window(None, conns, target.bodies, plan.warmup_s, plan.max_requests)
        cell = Cell(target, concurrency)
        await run_window(cell, conns, target.bodies, plan.measure_s, plan.max_requests)
        return cell
    finally:
        for conn in conns:
            await conn.close()


async def measure_all(targets: list[Target], plan: Plan) -> list[Cell]:
    cells = []
    for target in targets:
        for concurrency in CONCURRENCIES:
            say(f"measuring {target.name} at concurrency {concurrency}")
            cells.append(await measure(target, concurrency, plan))
    return cells


# -- setup and report ------------------------------------------------------------------------------


def digits_bodies() -> list[bytes]:
    samples = json.loads((ROOT / "examples/digits/samples.json").read_text())
    return [json.dumps({"pixels": s["pixels"]}).encode() for s in samples]


def make_targets(bare_url: str, ember_url: str, token: str) -> list[Target]:
    echo_body = [json.dumps({"message": "hello", "n": 42}).encode()]
    return [
        Target("bare echo", f"{bare_url}/echo", echo_body, is_ember=False, token=""),
        Target("hello.echo", f"{ember_url}/v1/hello/echo", echo_body, is_ember=True, token=token),
        Target("digits.predict", f"{ember_url}/v1/digits/Classifier.predict", digits_bodies(), is_ember=True,
               token=token),
    ]


def deploy_examples(url: str, token: str,
                    paths: tuple[str, ...] = ("examples/hello/hello.py", "examples/digits/classifier.py")) -> None:
    import ember
    from ember._client import Transport
    from ember._volume import put_volume

    transport = Transport(url, token=token)
    try:
        put_volume("digits-weights", [ROOT / "examples" / "digits" / "weights.pt"], transport=transport)
        for path in paths:
            say(f"deploying {path}")
            ember.deploy(ROOT / path, transport=transport, timeout_s=180)
    finally:
        transport.close()


def render_table(cells: list[Cell]) -> str:
    bare = {c.concurrency: c for c in cells if not c.target.is_ember}
    rows = [["target", "conc", "requests", "errors", "req/s", "p50 ms", "p95 ms", "p99 ms",
             "req/s vs bare", "p50 vs bare", "mean batch"]]
    for c in cells:
        base = bare.get(c.concurrency)
        relative = c.target.is_ember and base is not None
        rows.append([c.target.name, str(c.concurrency), str(c.requests), str(c.errors), f"{c.rps:,.0f}",
                     f"{c.percentile(50):.2f}", f"{c.percentile(95):.2f}", f"{c.percentile(99):.2f}",
                     f"{c.rps / base.rps:.2f}x" if relative else "-",
                     f"{c.percentile(50) / base.percentile(50):.2f}x" if relative else "-",
                     f"{c.mean_batch:.1f}" if c.target.is_ember else "-"])
    return markdown_table(rows)


def markdown_table(rows: list[list[str]]) -> str:
    """A Markdown table, aligned for the terminal too: first column left, the others right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(row: list[str]) -> str:
        cells = [v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))]
        return "| " + " | ".join(cells) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(rows[0]), rule, *(line(row) for row in rows[1:])])


def auth_headers() -> dict[str, str]:
    """The ``Authorization`` header of ``$EMBER_TOKEN`` (each benchmark sets it to its platform's admin token)."""
    token = os.environ.get("EMBER_TOKEN", "")
    return {"Authorization": f"Bearer {token}"} if token else {}


def run_interruptible(work: Callable[[], T]) -> T:
    """A benchmark's ``work``, run so that SIGTERM unwinds as Ctrl-C does (the cleanup in its ``finally`` stops every
    child process it started), SIGINT is handled even where it was inherited as ignored (a background job of a
    non-interactive shell), and an interrupt exits with 130."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return work()
    except KeyboardInterrupt:
        sys.exit(130)


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def run(plan: Plan) -> None:
    """Start everything, measure every cell, print the table; stop everything whatever happens."""
    from ember.dev.embedded import EmbeddedPlatform

    state_dir = Path(tempfile.mkdtemp(prefix="ember-bench-"))
    platform = EmbeddedPlatform(state_dir, http_port=0)
    echo_proc = None
    keep_logs = False
    try:
        say(f"starting the platform in {state_dir}")
        platform.start()
        deploy_examples(platform.url, platform.token)
        echo_proc, bare_url = start_echo_server()
        cells = ember_loop.run(measure_all(make_targets(bare_url, platform.url, platform.token), plan))
        print(render_table(cells))
    except Exception:
        keep_logs = True
        raise
    finally:
        say("stopping")
        if echo_proc is not None:
            stop_process(echo_proc)
        platform.stop()
        if keep_logs:
            say(f"logs kept in {platform.log_dir}")
        else:
            shutil.rmtree(state_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows, for a smoke run")
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo:
        serve_echo()
        return
    run_interruptible(lambda: run(QUICK if args.quick else FULL))


if __name__ == "__main__":
    main()
