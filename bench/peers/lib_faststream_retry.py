"""faststream-retry, from a checkout, through its public API only.

    FR_CHECKOUT=<checkout> FR_QUEUE_TYPE=classic|quorum \\
        python -m bench.peers.lib_faststream_retry <scenario>

FR_CHECKOUT (default: the repository this file is in) goes first on sys.path, so the
same harness measures any checkout. The subscriber is bare FastStream's (lib_faststream.py)
with RetryMiddleware(default=RetryPolicy(max_attempts=4, backoff=Fixed(delay)),
prefix=<the run's prefix>, queue_type=FR_QUEUE_TYPE (default "classic", like the peers'
queues), and with FR_TRACING=1 an SDK tracer provider whose exporter drops every span) passed
in middlewares= and installed; every other option is the plugin's default
(re-check prefetch 200, max_delay 1 day). The handler raises TransientError, or
RetryLater(delay) where a scenario gives each message its own delay.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

CHECKOUT = os.environ.get("FR_CHECKOUT") or str(Path(__file__).resolve().parents[2])
sys.path.insert(0, CHECKOUT)  # before faststream_retry is imported: the checkout measured

from faststream.rabbit import Channel, RabbitBroker, RabbitQueue  # noqa: E402

import faststream_retry  # noqa: E402
from bench.peers import driver  # noqa: E402
from faststream_retry import (  # noqa: E402
    Fixed,
    RetryLater,
    RetryMiddleware,
    RetryPolicy,
    TransientError,
)

QUEUE_TYPE = os.environ.get("FR_QUEUE_TYPE", "classic")
TRACED = os.environ.get("FR_TRACING") == "1"


def tracer_provider() -> Any:
    """An SDK tracer provider whose spans go nowhere: the cost of tracing, not of an exporter."""
    if not TRACED:
        return None
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415 - the traced column's
    from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Nowhere(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:  # noqa: ARG002
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Nowhere()))
    return provider


class FastStreamRetry:
    name = f"faststream-retry {QUEUE_TYPE}{'+tracing' if TRACED else ''}"
    version = version("faststream-retry")
    retries = True
    source = str(Path(faststream_retry.__file__).parent)

    def make(self, base: str, queue: str, spec: driver.Spec | None, rec: driver.Recorder) -> Any:
        assert spec is not None  # noqa: S101 - the happy path too runs with retries configured
        retry = RetryMiddleware(
            default=RetryPolicy(max_attempts=4, backoff=Fixed(spec.delay)),
            prefix=base,
            queue_type=QUEUE_TYPE,
            tracer_provider=tracer_provider(),
        )
        broker = RabbitBroker(
            driver.URL,
            default_channel=Channel(prefetch_count=driver.PREFETCH),
            middlewares=[retry],
        )
        retry.install(broker)
        context = broker.context

        @broker.subscriber(RabbitQueue(queue, durable=True))
        async def handler(body: Any) -> None:  # noqa: ARG001 - FastStream passes the body
            delay = rec.call(context.get_local("message").message_id)
            if delay is None:
                return
            if spec.explicit:
                raise RetryLater(delay)
            raise TransientError("bench: fails once")

        return broker

    async def start(self, app: RabbitBroker) -> None:
        await app.start()

    async def stop(self, app: RabbitBroker) -> None:
        await app.stop()


if __name__ == "__main__":
    driver.main(FastStreamRetry())
