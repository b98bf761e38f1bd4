"""A service whose retries and dead letters Prometheus scrapes."""

import os

from faststream import FastStream
from faststream.rabbit import RabbitBroker
from faststream.rabbit.prometheus import RabbitPrometheusMiddleware
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import REGISTRY, start_http_server

from faststream_retry import RetryMiddleware


async def charge(payment: dict[str, int]) -> None:
    """Your payment gateway."""


# --8<-- [start:wiring]
# The plugin reports through OpenTelemetry; this reader turns its metrics
# into Prometheus's, in prometheus_client's registry, where FastStream's
# own middleware writes too: one /metrics endpoint serves both.
meter_provider = MeterProvider(metric_readers=[PrometheusMetricReader()])
retry = RetryMiddleware(meter_provider=meter_provider)
broker = RabbitBroker(
    os.environ.get("RABBITMQ_URL", "amqp://guest:guest@localhost:5672/"),
    # RetryMiddleware first, the outermost: FastStream's middleware then
    # sees each failed attempt as status="error", before the plugin
    # settles the message (else a retried failure would count as "acked").
    middlewares=[retry, RabbitPrometheusMiddleware(registry=REGISTRY)],
)
app = FastStream(broker)


@app.on_startup
def serve_metrics() -> None:
    start_http_server(int(os.environ.get("METRICS_PORT", "9464")))


# --8<-- [end:wiring]


@broker.subscriber("payments")
async def handle(payment: dict[str, int]) -> None:
    await charge(payment)
