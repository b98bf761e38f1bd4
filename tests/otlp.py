"""A real OTLP/HTTP trace receiver on loopback, for the tests that export spans over the wire.

Jaeger and the OpenTelemetry Collector ingest this protocol; neither can be installed on
CI, so a test plays the receiver and decodes what arrives with opentelemetry-proto.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["Receiver", "receiver"]


class Receiver:
    """A minimal OTLP/HTTP trace receiver: POST /v1/traces, protobuf bodies."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces"
                if ok:
                    received.append(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        """What ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes: exporters add ``/v1/traces``."""
        self.endpoint = f"{self.base}/v1/traces"

    def spans(self) -> list[tuple[str, Any]]:
        """(service name, span) for every span received."""
        found: list[tuple[str, Any]] = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                service = next(
                    (
                        a.value.string_value
                        for a in resource_spans.resource.attributes
                        if a.key == "service.name"
                    ),
                    "",
                )
                for scope_spans in resource_spans.scope_spans:
                    found.extend((service, span) for span in scope_spans.spans)
        return found


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A receiver serving on a free port of 127.0.0.1 for the test."""
    receiver = Receiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
