"""An OTLP/HTTP trace receiver for tests: a real HTTP server that decodes what OpenTelemetry's exporters POST to
``/v1/traces`` (``ExportTraceServiceRequest``, protobuf) and keeps the spans."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SERVER, CONSUMER = 2, 5  # opentelemetry.proto.trace.v1.Span.SpanKind
ERROR = 2  # Status.StatusCode


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a root span
    kind: int
    service: str
    resource: dict[str, Any]
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]  # (trace id, span id)
    status: int
    start_ns: int
    end_ns: int


@dataclass
class Receiver:
    """``with Receiver() as otlp:`` serves on ``otlp.endpoint`` (what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes)."""

    spans: list[Span] = field(default_factory=list)
    posts: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._keep(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    @property
    def endpoint(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    found.append(Span(name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                                      parent_id=s.parent_span_id.hex(), kind=s.kind,
                                      service=str(resource.get("service.name", "")), resource=resource,
                                      attributes={kv.key: _value(kv.value) for kv in s.attributes},
                                      links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                                      status=s.status.code, start_ns=s.start_time_unix_nano,
                                      end_ns=s.end_time_unix_nano))
        with self._lock:
            self.spans.extend(found)
            self.posts += 1

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None
