"""The SDK's in-memory exporter in place of an OTLP endpoint, a real OTLP/HTTP receiver on loopback, and a lineage
driven as an operator drives one."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from planner_site import tracing
from tests.api.conftest import api, external_agent, raw_token, tooled  # noqa: F401 (the API's fixtures, reused)


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Export on, to memory, span by span; off again after the test."""
    from planning import trace_spans

    trace_spans._exported.clear()  # ids come again from test to test
    trace_spans._kinds.clear()
    trace_spans._kept.clear()  # what a test's services wrote, kept for the next export: not the next test's
    trace_spans._kept_of_plan.clear()
    exporter = InMemorySpanExporter()
    tracing.provider_install(exporter)
    yield exporter
    tracing.provider_install(None)


@dataclass(frozen=True)
class Received:
    """A span as a receiver got it, with the `service.name` of the process that sent it."""

    service: str
    span: Span

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()


class OtlpReceiver:
    """An OTLP/HTTP receiver on loopback, as a tracing tool's collector: decodes each export (protobuf, with
    `opentelemetry-proto`) and keeps it; `url` is its endpoint (the exporters append /v1/traces)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, ExportTraceServiceRequest]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver.lock:
                    receiver.requests.append((self.path, request))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list[Received]:
        with self.lock:
            requests = [request for _, request in self.requests]
        return [Received(service=next((a.value.string_value for a in rs.resource.attributes
                                       if a.key == "service.name"), ""), span=span)
                for request in requests for rs in request.resource_spans for ss in rs.scope_spans
                for span in ss.spans]


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as otlp:
        yield otlp
