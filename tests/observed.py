"""An SDK of a test's own for the plugin's telemetry: spans in memory, metrics read on demand.

Passed to ``RetryMiddleware(tracer_provider=..., meter_provider=...)``, so a test reads what
an exporter would receive, on any broker, without the global providers.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from faststream_retry.reporting.telemetry import ATTR, METRICS

__all__ = ["Observed"]


class Observed:
    """The providers a middleware reports to, and what reached them."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def providers(self) -> dict[str, Any]:
        """``RetryMiddleware``'s keyword arguments for these providers."""
        return {"tracer_provider": self.tracer_provider, "meter_provider": self.meter_provider}

    def spans(self, operation: str) -> list[ReadableSpan]:
        """The finished spans whose name ends with ``operation`` (``retry scheduled``, ...)."""
        return [s for s in self.exporter.get_finished_spans() if s.name.endswith(f" {operation}")]

    def attributes(self, operation: str) -> list[dict[str, Any]]:
        """The attributes of each finished ``operation`` span."""
        return [dict(s.attributes or {}) for s in self.spans(operation)]

    def systems(self) -> set[Any]:
        """Every ``messaging.system`` on a finished span."""
        return {(s.attributes or {}).get(ATTR.SYSTEM) for s in self.exporter.get_finished_spans()}

    def dead_letter_gauge(self) -> dict[str, int]:
        """Read the metrics now (a scrape): the dead-letter gauge's value per queue."""
        data = self.reader.get_metrics_data()
        found: dict[str, int] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != METRICS.DLQ_MESSAGES:
                        continue
                    for point in metric.data.data_points:
                        if isinstance(point, NumberDataPoint):
                            found[str((point.attributes or {})[ATTR.QUEUE])] = int(point.value)
        return found

    def counter(self, name: str) -> int:
        """Read the metrics now: counter ``name`` (``METRICS.*``) summed over its labels."""
        data = self.reader.get_metrics_data()
        total = 0
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        total += sum(
                            int(p.value)
                            for p in metric.data.data_points
                            if isinstance(p, NumberDataPoint)
                        )
        return total
