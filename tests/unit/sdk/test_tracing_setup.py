"""``ember._tracing``: when the environment asks for traces, the trace context read from hostile headers, and what a
process that traces (or does not) holds. ``setup`` sets a process-wide provider: it runs in subprocesses here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ember import _tracing as tracing

TRACE_ID, SPAN_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
VALID = f"00-{TRACE_ID}-{SPAN_ID}-01"


@pytest.mark.parametrize(("env", "expected"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, False),
    ({"OTEL_TRACES_EXPORTER": "zipkin, OTLP"}, True),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
    ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "console"}, False),
    ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_METRICS_EXPORTER": "otlp"}, False),  # metrics are not traces
])
def test_the_environment_decides_whether_to_trace(env: dict[str, str], expected: bool) -> None:
    assert tracing.wanted(env) is expected


def _ids(context: object) -> tuple[str, str, bool]:
    from opentelemetry import trace

    span_context = trace.get_current_span(context).get_span_context()  # type: ignore[arg-type]
    return f"{span_context.trace_id:032x}", f"{span_context.span_id:016x}", span_context.is_remote


def test_a_valid_traceparent_names_the_parent_and_keeps_its_tracestate() -> None:
    context = tracing.parent_from({"traceparent": VALID, "tracestate": "vendor=abc,other=1"})
    assert _ids(context) == (TRACE_ID, SPAN_ID, True)
    from opentelemetry import trace

    assert trace.get_current_span(context).get_span_context().trace_state.get("vendor") == "abc"


def test_nats_headers_are_matched_in_any_case_and_an_oversized_tracestate_alone_is_dropped() -> None:
    context = tracing.parent_from({"Traceparent": VALID, "TraceState": "v=" + "x" * 600, "Ember-Call-Id": "c1"})
    assert _ids(context)[:2] == (TRACE_ID, SPAN_ID)
    from opentelemetry import trace

    assert len(trace.get_current_span(context).get_span_context().trace_state) == 0


@pytest.mark.parametrize("carrier", [
    None,
    {},
    {"tracestate": "a=b"},
    {"traceparent": ""},
    {"traceparent": "garbage"},
    {"traceparent": f"00-{TRACE_ID}-{SPAN_ID}"},  # no flags
    {"traceparent": f"00-{'0' * 32}-{SPAN_ID}-01"},
    {"traceparent": f"00-{TRACE_ID}-{'0' * 16}-01"},
    {"traceparent": f"ff-{TRACE_ID}-{SPAN_ID}-01"},
    {"traceparent": f"00-{TRACE_ID.upper()}-{SPAN_ID}-01"},
    {"traceparent": f"00-{TRACE_ID}-{SPAN_ID}-01-extra"},
    {"traceparent": f"00-{TRACE_ID[:-1]}g-{SPAN_ID}-01"},
    {"traceparent": f"00-{TRACE_ID}-{SPAN_ID}-01" + " " * 300},  # oversized: not even parsed
    {"traceparent": "0" * 100_000},
    {"traceparent": f"00-{TRACE_ID}-{SPAN_ID}-01\n00-{TRACE_ID}-{SPAN_ID}-01"},
    {"traceparent": b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},  # not text
    {"traceparent": ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]},
    {**{f"h{i}": "x" for i in range(100)}, "TRACEPARENT": VALID},  # too many headers to search by case
])
def test_a_missing_or_malformed_traceparent_starts_a_new_trace(carrier: dict[str, object] | None) -> None:
    assert tracing.parent_from(carrier) is None  # type: ignore[arg-type]


UNSAMPLED = f"00-{TRACE_ID}-{SPAN_ID}-00"


@pytest.mark.parametrize(("carrier", "expected"), [
    ({"traceparent": UNSAMPLED}, True),
    ({"Traceparent": UNSAMPLED, "Ember-Call-Id": "c1"}, True),  # NATS headers keep their case
    ({"traceparent": f"00-{TRACE_ID}-{SPAN_ID}-02"}, True),  # another flag, not "sampled"
    ({"traceparent": VALID}, False),
    ({"traceparent": f"00-{TRACE_ID}-{SPAN_ID}-03"}, False),
    ({"traceparent": f"cc-{TRACE_ID}-{SPAN_ID}-00-what-the-future-holds"}, False),  # a later version: the SDK reads it
    ({"traceparent": f"00-{'0' * 32}-{SPAN_ID}-00"}, False),  # invalid: a new trace, sampled as a root
    ({"traceparent": f"00-{TRACE_ID}-{'0' * 16}-00"}, False),
    ({"traceparent": f"00-{TRACE_ID.upper()}-{SPAN_ID}-00"}, False),
    ({"traceparent": f"00-{TRACE_ID}-{SPAN_ID}-0g"}, False),
    ({"traceparent": UNSAMPLED + "\n"}, False),
    ({"traceparent": UNSAMPLED.encode()}, False),
    ({**{f"h{i}": "x" for i in range(100)}, "TRACEPARENT": UNSAMPLED}, False),
    ({}, False),
    (None, False),
])
def test_a_call_whose_trace_is_not_sampled_is_told_apart_strictly(carrier: dict[str, object] | None,
                                                                 expected: bool) -> None:
    assert tracing.unsampled(carrier) is expected  # type: ignore[arg-type]


def test_a_sampler_that_ignores_parents_decides_every_call_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_parent_based", False)  # OTEL_TRACES_SAMPLER=traceidratio, say
    assert tracing.unsampled({"traceparent": UNSAMPLED}) is False


def test_the_w3c_examples_of_later_versions_are_read_with_their_extra_fields() -> None:
    assert _ids(tracing.parent_from({"traceparent": f"cc-{TRACE_ID}-{SPAN_ID}-01-what-the-future-holds"}))[0] \
        == TRACE_ID


def _run(code: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                          env={**clean, **env})
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


STATE = """
import json, sys, threading
from ember import _tracing as tracing
on = tracing.setup("ember-test", {"ember.app": "a"})
print(json.dumps({"on": on, "flag": tracing.ON, "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
                  "threads": sorted(t.name for t in threading.enumerate())}))
"""


def test_off_nothing_of_opentelemetry_is_loaded_and_no_exporter_thread_runs() -> None:
    for env in ({}, {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}):
        state = _run(STATE, **env)
        assert state == {"on": False, "flag": False, "otel": [], "threads": ["MainThread"]}, env


def test_on_a_batch_exporter_thread_runs() -> None:
    state = _run(STATE, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_BSP_SCHEDULE_DELAY="60000")
    assert state["on"] is True and state["flag"] is True
    assert "opentelemetry.exporter.otlp.proto.http.trace_exporter" in state["otel"]  # type: ignore[operator]
    threads: list[str] = state["threads"]  # type: ignore[assignment]
    assert any("BatchSpanProcessor" in name or "Otel" in name for name in threads)


def test_spans_are_exported_with_the_service_and_resource_at_shutdown() -> None:
    code = """
    import json, sys
    from ember import _tracing as tracing
    assert tracing.setup("ember-replica", {"ember.app": "hello", "ember.version": 3})
    parent = tracing.parent_from({"traceparent": "VALID"})
    span = tracing.start("ember.call", parent, kind="server", attributes={"ember.call_id": "c1"})
    child = tracing.start("ember.run", tracing.context_of(span))
    token = tracing.activate(span)
    carried = tracing.current_headers({"ember.extra": 1})
    tracing.deactivate(token)
    tracing.end(child, "remote_error")
    tracing.end(span)
    assert tracing.current_headers() == {}
    sys.stdout.flush()
    tracing.shutdown()
    print(json.dumps({"carried": carried, "on": tracing.ON}))
    """.replace("VALID", VALID)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
                               "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": ""})
    assert proc.returncode == 0, proc.stderr
    *exported, last = proc.stdout.strip().splitlines()
    result = json.loads(last)
    assert result["on"] is False  # shut down
    assert result["carried"]["traceparent"].startswith(f"00-{TRACE_ID}-") and result["carried"]["traceparent"] != VALID
    text = "\n".join(exported)
    spans = json.loads("[" + text.replace("}\n{", "},\n{") + "]")
    by_name = {s["name"]: s for s in spans}
    call, run = by_name["ember.call"], by_name["ember.run"]
    assert call["context"]["trace_id"] == "0x" + TRACE_ID and call["parent_id"] == "0x" + SPAN_ID
    assert call["kind"] == "SpanKind.SERVER" and call["attributes"] == {"ember.call_id": "c1", "ember.extra": 1}
    assert run["parent_id"] == call["context"]["span_id"] and run["status"]["status_code"] == "ERROR"
    assert call["resource"]["attributes"]["service.name"] == "ember-replica"
    assert call["resource"]["attributes"]["ember.app"] == "hello"


def test_without_the_package_tracing_stays_off_and_says_why() -> None:
    code = """
    import json, logging, sys
    sys.modules["opentelemetry"] = None  # as if not installed
    logging.basicConfig(level=logging.WARNING)
    from ember import _tracing as tracing
    print(json.dumps({"on": tracing.setup("ember-platform")}))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"on": False}
    assert "ember[tracing]" in proc.stderr


def test_the_call_path_imports_nothing_of_opentelemetry_until_tracing_starts() -> None:
    state = _run("""
    import json, sys
    import ember_platform.__main__, ember_platform.gateway.asgi, ember_platform.gateway.relay
    import ember_runtime.replica.process, ember_runtime.replica.queue_worker
    print(json.dumps({"otel": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}))
    """)
    assert state == {"otel": []}


def test_a_collector_that_never_answers_does_not_hold_a_stopping_process() -> None:
    code = """
    import json, socket, time
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections wait in the backlog: nothing ever answers
    import os
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:%d" % silent.getsockname()[1]
    from ember import _tracing as tracing
    tracing.FLUSH_LIMIT_S = 1.0
    assert tracing.setup("ember-test")
    tracing.end(tracing.start("ember.call"))
    started = time.monotonic()
    tracing.shutdown()
    print(json.dumps(time.monotonic() - started))
    """
    waited = _run(code)
    assert 0.9 <= waited < 10  # type: ignore[operator]  # not the exporter's own 10 s: FLUSH_LIMIT_S bounds it


@pytest.mark.parametrize(("sampler", "parent_based"), [
    ("", True), ("parentbased_traceidratio", True), ("ParentBased_Always_On", True), ("traceidratio", False),
    ("always_on", False),
])
def test_setup_reads_whether_the_sampler_follows_a_parent(sampler: str, parent_based: bool) -> None:
    code = """
    import json
    from ember import _tracing as tracing
    tracing.setup("ember-test")
    print(json.dumps({"on": tracing.ON, "parent_based": tracing._parent_based}))
    """
    env = {"OTEL_TRACES_EXPORTER": "console", **({"OTEL_TRACES_SAMPLER": sampler} if sampler else {})}
    assert _run(code, **env) == {"on": True, "parent_based": parent_based}


def test_an_unsampled_calls_context_travels_on_exactly_as_the_propagator_writes_it() -> None:
    code = f"""
    import json
    from ember import _tracing as tracing
    tracing.setup("ember-test")
    out = {{}}
    for flags in ("00", "01"):
        span = tracing.start("a", tracing.parent_from({{"traceparent": "00-{TRACE_ID}-{SPAN_ID}-" + flags,
                                                        "tracestate": "v=1,w=2"}}))
        token = tracing.activate(span)
        out[flags] = [tracing.current_headers({{"ember.call_id": "c"}}), tracing.headers_of(span),
                      span.is_recording()]
        tracing.deactivate(token)
    print(json.dumps(out))
    """
    out = _run(code, OTEL_TRACES_EXPORTER="console", OTEL_TRACES_SAMPLER="parentbased_always_on")
    for flags, recording in (("00", False), ("01", True)):
        fast, written, is_recording = out[flags]  # type: ignore[misc]
        assert fast == written and is_recording is recording
        assert fast["traceparent"].startswith(f"00-{TRACE_ID}-") and fast["traceparent"].endswith(f"-{flags}")
        assert fast["tracestate"] == "v=1,w=2"
