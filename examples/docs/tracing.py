"""Tracing an app and its retries: the OpenTelemetry SDK, exported by OTLP/HTTP.

pip install 'faststream-retry[otel]'. Where the spans go is the standard
environment's: OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318, the
OTLP/HTTP port of Jaeger or a collector).
"""

import os

from faststream import FastStream
from faststream.rabbit import RabbitBroker
from faststream.rabbit.opentelemetry import RabbitTelemetryMiddleware
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from faststream_retry import RetryMiddleware

# The name Jaeger lists the service under (it wins over OTEL_SERVICE_NAME).
resource = Resource.create({"service.name": "notifications"})
provider = TracerProvider(resource=resource)
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))

broker = RabbitBroker(
    os.environ.get("RABBITMQ_URL", "amqp://guest:guest@localhost:5672/"),
    middlewares=[
        # FastStream's spans first: the retry's nest under its "process" span.
        RabbitTelemetryMiddleware(tracer_provider=provider),
        RetryMiddleware(tracer_provider=provider),
    ],
)
app = FastStream(broker)


@app.after_shutdown
async def export_the_last_spans() -> None:
    provider.shutdown()  # the batch processor sends what it still holds
