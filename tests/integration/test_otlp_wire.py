"""Spans over the wire: the real OTLP/HTTP exporter into a receiver on loopback.

Jaeger ingests this same protocol; it cannot be installed on CI, so the test plays the
receiver (``tests.otlp``) and decodes what arrives with opentelemetry-proto.
"""

from __future__ import annotations

import importlib
from typing import Any, cast

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from faststream_retry import Fixed, RetryPolicy
from faststream_retry.core.events import EventKind
from tests.otlp import Receiver, receiver
from tests.rabbit import App, eventually, unique

pytestmark = pytest.mark.rabbit

__all__ = ["receiver"]  # the fixture


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


async def test_the_tracing_how_to_s_setup_exports_the_app_s_and_the_retry_s_spans(
    rabbit_url: str, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The setup the how-to shows, as written: one trace, FastStream's spans and the retry's.

    Configured by the standard environment alone (the endpoint); the app's shutdown
    exports what is still batched.
    """
    monkeypatch.setenv("RABBITMQ_URL", rabbit_url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.base)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    example = importlib.reload(importlib.import_module("examples.docs.tracing"))
    queue = unique("traced")
    calls = 0

    @example.broker.subscriber(queue)
    async def handle(body: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("smtp down")

    async with example.broker:
        await example.broker.start()
        await example.broker.publish("x", queue=queue)
        await eventually(lambda: calls == 2, timeout=30, what="the retried call")
    await example.export_the_last_spans()  # what `faststream run` calls after shutdown

    spans = receiver.spans()
    names = {span.name for _, span in spans}
    assert {f"{queue} retry scheduled", f"{queue} retry release"} <= names
    assert any(name.endswith(" process") for name in names), names
    assert {service for service, _ in spans} == {"notifications"}
    assert len({span.trace_id for _, span in spans if not span.name.endswith("publish")}) == 1
