"""The cost of tracing on the call path: the same calls through a platform that traces every call (the control
plane's ``ember.gateway`` span, the replica's ``ember.call``, ``ember.queue``, ``ember.batch`` and ``ember.run``,
exported over OTLP/HTTP) and through one that does not, in the same run.

What is measured
    * the spans of one call, in one process: what the gateway and the replica add to a call when tracing is on
      (reading a ``traceparent``, five spans started and ended, the context carried on), with OpenTelemetry's batch
      span processor and an exporter that drops what it is given (microseconds per call);
    * ``hello.echo`` over HTTP (examples/hello/hello.py) through each platform: p50 latency at concurrency 1 and
      requests/s at concurrency 64, the load generator of ``bench/http_latency.py``. Every call is traced (the
      default sampler, ``parentbased_always_on``: the most tracing costs); the load generator sends no
      ``traceparent``, so the gateway starts each trace.

How
    Two ``EmbeddedPlatform``s (each a nats-server, a control plane, a node agent and hello's replicas) in a temporary
    directory: the traced one started with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at an OTLP/HTTP sink in a child
    process (it reads each export and answers 200), which its agent passes on to its replicas; the other with no
    ``OTEL_*`` variable (tracing off: one attribute test per place a span would start). Rounds alternate the two,
    in alternating order (``ab.measure_rounds``); the table gives each one's median over the rounds and their ratio.
    ``--same`` starts both without tracing (an A/A run: the resolution of the comparison on this machine);
    ``--sample R`` traces a fraction R of the calls (``OTEL_TRACES_SAMPLER=parentbased_traceidratio``): the others'
    spans are not recorded, which is most of their cost.

Usage
    python bench/tracing_cost.py [--rounds N] [--quick] [--same | --sample R]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from ab import ab_table, measure_rounds  # noqa: E402  (bench/ is not a package)
from http_latency import FULL, QUICK, Plan, Target, deploy_examples, run_interruptible, say, stop_process  # noqa: E402

from ember.dev.embedded import EmbeddedPlatform  # noqa: E402

ECHO_BODY = [json.dumps({"message": "hello", "n": 42}).encode()]
CALLS = 20_000

SPANS_OF_A_CALL = """
import json, time
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from ember import _tracing as tracing
from ember_runtime.batching import spans

class Dropped(SpanExporter):
    def export(self, batch):
        return SpanExportResult.SUCCESS

provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(Dropped()))
tracing._propagation()
tracing._tracer, tracing.ON = provider.get_tracer("ember"), True
headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}

def one_call():
    gateway = tracing.start("ember.gateway", tracing.parent_from(headers), kind="server",
                            attributes={"http.request.method": "POST", "http.route": "/v1/{app}/{name}"})
    token = tracing.activate(gateway)
    carried = tracing.current_headers({"ember.call_id": "c"})
    call = spans.call(carried, "c", "echo")
    batch = spans.begin([call], "echo", 1)
    spans.end(batch)
    spans.answered(call, None)
    tracing.deactivate(token)
    gateway.set_attribute("http.response.status_code", 200)
    tracing.end(gateway)

best = float("inf")
for _ in range(5):
    started = time.perf_counter()
    for _ in range(CALLS):
        one_call()
    best = min(best, (time.perf_counter() - started) / CALLS * 1e6)
    provider.force_flush()
provider.shutdown()
print(json.dumps(best))
"""

SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def spans_cost_us() -> float:
    """Microseconds of tracing per call (both processes' spans, in one), best of 5, in a child process (tracing sets
    a process-wide provider)."""
    code = textwrap.dedent(SPANS_OF_A_CALL).replace("CALLS", str(CALLS))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    return float(json.loads(proc.stdout.strip().splitlines()[-1]))


def start_sink() -> tuple[subprocess.Popen[bytes], str]:
    """An OTLP/HTTP sink in a child process: it reads each export and answers 200."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SINK)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}"


def start_platform(work: Path, name: str, otel: dict[str, str]) -> EmbeddedPlatform:
    """An ``EmbeddedPlatform`` under ``work/name`` whose processes start with ``otel`` in their environment, with
    hello deployed."""
    platform = EmbeddedPlatform(work / name, http_port=0)
    saved = {k: os.environ.get(k) for k in otel}
    os.environ.update(otel)
    try:
        platform.start()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    deploy_examples(platform.url, platform.token, ("examples/hello/hello.py",))
    return platform


def render(results: dict[str, list[float]], spans_us: float, rounds: int, same: bool,
           sample: float | None = None) -> str:
    first = "first, untraced (A/A)" if same else "tracing on" if sample is None else f"on, {sample:g} sampled"
    spans = ["the spans of one call, in one process (us)", f"{spans_us:.1f}", "0", f"{spans_us:+.1f}", "-"]
    return ab_table(results, rounds, first, "tracing off", before=[spans])


def run(rounds: int, plan: Plan, same: bool, sample: float | None = None) -> None:
    work = Path(tempfile.mkdtemp(prefix="ember-tracing-bench-"))
    platforms: list[EmbeddedPlatform] = []
    sink = None
    keep = False
    try:
        say("the spans of one call, in one process")
        spans_us = spans_cost_us()
        sink, endpoint = start_sink()
        otel = {} if same else {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
        if sample is not None and not same:
            otel |= {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": repr(sample)}
        say(f"starting the platforms in {work}")
        traced = start_platform(work, "traced", otel)
        platforms.append(traced)
        untraced = start_platform(work, "untraced", {})
        platforms.append(untraced)
        on = Target("tracing on", f"{traced.url}/v1/hello/echo", ECHO_BODY, is_ember=True, token=traced.token)
        off = Target("tracing off", f"{untraced.url}/v1/hello/echo", ECHO_BODY, is_ember=True, token=untraced.token)
        print(render(measure_rounds(on, off, rounds, plan, "tracing"), spans_us, rounds, same, sample))
    except Exception:
        keep = True
        raise
    finally:
        say("stopping")
        for platform in platforms:
            platform.stop()
        if sink is not None:
            stop_process(sink)
        if keep:
            say(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of both (default 5)")
    parser.add_argument("--quick", action="store_true", help="shorter windows, for a smoke run")
    parser.add_argument("--same", action="store_true", help="an A/A run: neither platform traces")
    parser.add_argument("--sample", type=float, default=None, metavar="R",
                        help="trace this fraction of the calls (0 to 1) rather than all")
    args = parser.parse_args()
    started = time.monotonic()
    run_interruptible(lambda: run(args.rounds, QUICK if args.quick else FULL, args.same, args.sample))
    say(f"done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
