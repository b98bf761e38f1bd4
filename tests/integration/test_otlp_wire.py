"""Spans over the wire: the real OTLP/HTTP exporter into a receiver on loopback.

Jaeger ingests this same protocol; it cannot be installed on CI, so the test plays the
receiver and decodes what arrives with opentelemetry-proto.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from faststream_retry import Fixed, RetryPolicy
from faststream_retry.core.events import EventKind
from tests.rabbit import App, eventually, unique

pytestmark = pytest.mark.rabbit


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
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

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
    receiver = Receiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


async def test_retry_spans_reach_an_otlp_receiver(make_app: Any, receiver: Receiver) -> None:
    """A retried message's spans arrive over OTLP/HTTP, all in one trace."""
    provider = TracerProvider(resource=Resource.create({"service.name": "retry-wire-test"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=receiver.endpoint)))
    app: App = make_app(default=RetryPolicy(backoff=Fixed(0.1)), tracer_provider=provider)
    queue = unique("wire")
    calls = 0

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("down")

    await app.start()
    await app.broker.publish("x", queue=queue)
    await eventually(lambda: calls == 2, what="the retried call")
    await eventually(lambda: any(e.kind is EventKind.RELEASED for e in app.events), what="release")
    await app.stop()
    assert provider.force_flush(timeout_millis=10_000)
    cast("Any", provider).shutdown()  # typed only in newer SDKs

    spans = receiver.spans()
    assert sorted(span.name for _, span in spans) == [
        f"{queue} retry release",
        f"{queue} retry scheduled",
    ]
    assert {service for service, _ in spans} == {"retry-wire-test"}
    assert len({span.trace_id for _, span in spans}) == 1
    by_name = {span.name: span for _, span in spans}
    release, scheduled = by_name[f"{queue} retry release"], by_name[f"{queue} retry scheduled"]
    assert release.parent_span_id == scheduled.span_id
    attributes = {a.key: a.value for a in scheduled.attributes}
    assert attributes["faststream_retry.attempt"].int_value == 1
    assert attributes["faststream_retry.delay_ms"].int_value == 100
