"""The plugin's OpenTelemetry handles: tracer, meter, instruments and the names they use.

The API only; the SDK and exporters are yours. ``ATTR`` and ``METRICS`` are the names
dashboards select on. ``Telemetry`` holds the tracer and the instruments, says whether
spans are recorded, and starts spans; what each event's span carries and what it counts
are ``spans.SPANS`` and ``metrics.COUNTS``.

Each step span's context is injected into the copy it publishes (``traceparent``), and
the next step continues from it, so a message's whole life, every attempt included, is
one trace. Under FastStream's ``RabbitTelemetryMiddleware`` the middleware's spans are
children of its process span; without it they continue from the message's
``traceparent``.

With no SDK configured, no span is made and headers travel unchanged.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode

__all__ = ["ATTR", "METRICS", "RABBITMQ", "Telemetry", "duration_buckets"]

TRACER_NAME = "faststream_retry"

RABBITMQ = "rabbitmq"
"""``messaging.system`` of a span whose attributes name none (the worker's, RabbitMQ's):
each runtime passes its broker's word as data (``Reporter.on``), the reporting imports none."""

_LOOK_AGAIN_S = 1.0

_LADDER_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 43200.0, 86400.0, 259200.0, 604800.0,
    2592000.0,
)  # fmt: skip

_DAY_S = 86400.0


def duration_buckets(longest_s: float) -> tuple[float, ...]:
    """Return histogram bucket boundaries, in seconds, from 5 ms up to ``longest_s``.

    The SDK's default boundaries end at 10 (meant for milliseconds): a 30-minute delay
    would land in ``+Inf``. The last boundary is ``longest_s`` itself, so the
    largest value the plugin can record (``max_delay``) still has a bucket.
    """
    longest = float(longest_s)
    below = tuple(b for b in _LADDER_S if b < longest)
    return (*below, longest) if longest > 0 else below


class ATTR:
    """Span and metric attribute names (semantic conventions where they apply)."""

    SYSTEM = "messaging.system"
    """``rabbitmq``, ``nats`` or ``redis``: the broker of the runtime that made the span."""
    DESTINATION = "messaging.destination.name"
    """Where a step's copy is published: RabbitMQ's exchange (or, by the default exchange,
    its queue), NATS's subject, Redis's key (the schedule, or the ``.dlq`` stream)."""
    OPERATION = "messaging.operation.type"
    MESSAGE_ID = "messaging.message.id"
    ROUTING_KEY = "messaging.rabbitmq.destination.routing_key"
    """RabbitMQ only."""
    QUEUE = "faststream_retry.queue"
    ATTEMPT = "faststream_retry.attempt"
    MAX_ATTEMPTS = "faststream_retry.max_attempts"
    CLASSIFICATION = "faststream_retry.classification"
    RULE = "faststream_retry.rule"
    DELAY_MS = "faststream_retry.delay_ms"
    DUE_MS = "faststream_retry.due_ms"
    NOW_MS = "faststream_retry.now_ms"
    REMAINING_MS = "faststream_retry.remaining_ms"
    TIER_MS = "faststream_retry.tier_ms"
    LATENESS_MS = "faststream_retry.lateness_ms"
    REASON = "faststream_retry.reason"
    DLQ = "faststream_retry.dlq"
    IMMEDIATE = "faststream_retry.immediate"
    OUTAGE_AFTER = "faststream_retry.outage.after"
    OUTAGE_PROBE_MS = "faststream_retry.outage.probe_ms"
    OUTAGE_FAILURES = "faststream_retry.outage.failures"
    OUTAGE_PROBE_COUNT = "faststream_retry.outage.probe_count"
    OUTAGE_DURATION_MS = "faststream_retry.outage.duration_ms"
    OUTAGE_END = "faststream_retry.outage.end"
    EXCEPTION_TYPE = "exception.type"
    EXCEPTION_MESSAGE = "exception.message"


class METRICS:
    """Metric names; every one carries ``faststream_retry.queue``."""

    SCHEDULED = "faststream_retry.retries.scheduled"
    """Counter: retries scheduled (attribute: classification rule)."""
    RELEASED = "faststream_retry.retries.released"
    """Counter: due messages released back to their queue."""
    DEAD_LETTERED = "faststream_retry.dead_lettered"
    """Counter: dead letters (attribute: reason)."""
    FAILURES = "faststream_retry.failures"
    """Counter: handler failures (attribute: classification)."""
    LATENESS = "faststream_retry.lateness"
    """Histogram, seconds: release time minus due time."""
    PLANNED_DELAY = "faststream_retry.planned_delay"
    """Histogram, seconds: the delay each scheduled retry was given."""
    OUTAGE_ACTIVE = "faststream_retry.outage.active"
    """Up-down counter: 1 while the queue is in outage mode in this process, else 0."""
    OUTAGE_ENTERED = "faststream_retry.outage.entered"
    """Counter: times the queue went into outage mode."""
    OUTAGE_PROBES = "faststream_retry.outage.probes"
    """Counter: messages let through as probes while in outage mode."""
    OUTAGE_REQUEUED = "faststream_retry.outage.requeued"
    """Counter: held messages requeued (held for ``outage_hold``, or the broker stopping)."""
    OUTAGE_DURATION = "faststream_retry.outage.duration"
    """Histogram, seconds: how long each outage mode lasted."""
    DLQ_MESSAGES = "faststream_retry.dlq.messages"
    """Gauge: the messages in the queue's dead-letter queue or stream, sampled when the
    metrics are read: RabbitMQ, the ``.dlq``'s ready messages; NATS, the messages on the
    subscriber's dead-letter subject in its stream's dead-letter stream; Redis, ``XLEN``
    of the stream's ``.dlq``."""


class _HeaderGetter(Getter[Mapping[str, Any]]):
    """Reads propagation headers, ignoring any value that is not a string (untrusted)."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get(key)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return [k for k in carrier if isinstance(k, str)]


_GETTER = _HeaderGetter()


class Telemetry:
    """The plugin's tracer, meter and instruments."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        max_delay_s: float = _DAY_S,
    ) -> None:
        """Use the given providers, or the global ones (set later is fine).

        ``max_delay_s``: the longest delay the plugin gives (``max_delay``), where the
        delay and lateness histograms' buckets end; an outage's reach at least a day.
        """
        self._tracing = tracer_provider is not None
        self._look_again_at = 0.0
        self.tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
        meter = metrics.get_meter(TRACER_NAME, meter_provider=meter_provider)
        self.scheduled = meter.create_counter(
            METRICS.SCHEDULED, unit="{message}", description="Retries scheduled"
        )
        self.released = meter.create_counter(
            METRICS.RELEASED, unit="{message}", description="Due messages released"
        )
        self.dead_lettered = meter.create_counter(
            METRICS.DEAD_LETTERED, unit="{message}", description="Messages dead-lettered"
        )
        self.failures = meter.create_counter(
            METRICS.FAILURES, unit="{failure}", description="Handler failures by classification"
        )
        delays = duration_buckets(max_delay_s)
        self.lateness = meter.create_histogram(
            METRICS.LATENESS,
            unit="s",
            description="Release time minus due time",
            explicit_bucket_boundaries_advisory=delays,
        )
        self.planned_delay = meter.create_histogram(
            METRICS.PLANNED_DELAY,
            unit="s",
            description="Delay of each scheduled retry",
            explicit_bucket_boundaries_advisory=delays,
        )
        self.outage_active = meter.create_up_down_counter(
            METRICS.OUTAGE_ACTIVE, unit="{queue}", description="Queues in outage mode"
        )
        self.outage_entered = meter.create_counter(
            METRICS.OUTAGE_ENTERED, unit="{outage}", description="Outage modes entered"
        )
        self.outage_probes = meter.create_counter(
            METRICS.OUTAGE_PROBES, unit="{message}", description="Probes in outage mode"
        )
        self.outage_requeued = meter.create_counter(
            METRICS.OUTAGE_REQUEUED, unit="{message}", description="Held messages requeued"
        )
        self.outage_duration = meter.create_histogram(
            METRICS.OUTAGE_DURATION,
            unit="s",
            description="Duration of each outage mode",
            explicit_bucket_boundaries_advisory=duration_buckets(max(max_delay_s, _DAY_S)),
        )
        self.dlq_depths: dict[str, int] = {}
        """Each covered queue's dead letters as last sampled (``reporting.depths``: each
        broker's sampler writes its runtime's queues here)."""
        self.on_read: list[Callable[[], None]] = []
        """Called each time the metrics are read: asks the samplers for fresh depths."""
        meter.create_observable_gauge(
            METRICS.DLQ_MESSAGES,
            callbacks=[self._observe_dlq_depths],
            unit="{message}",
            description="Messages in the queue's dead-letter queue or stream",
        )

    def _observe_dlq_depths(self, _: CallbackOptions) -> Iterator[Observation]:
        # Called by the metric reader, often on a thread of its own (an HTTP scrape):
        # it reads the last samples, and asks for new ones for the next read.
        for wake in tuple(self.on_read):
            wake()
        for queue, messages in tuple(self.dlq_depths.items()):
            yield Observation(messages, {ATTR.QUEUE: queue})

    @property
    def tracing(self) -> bool:
        """Return whether spans would be recorded (an SDK provider is configured).

        The global provider can be set once, at any time: once it is, the answer
        stays yes. Until then it is looked up at most once a second, because the
        lookup reads the environment (a cost on every failure of a busy consumer).
        """
        if self._tracing:
            return True
        now = time.monotonic()
        if now >= self._look_again_at:
            self._look_again_at = now + _LOOK_AGAIN_S
            self._tracing = not isinstance(trace.get_tracer_provider(), ProxyTracerProvider)
        return self._tracing

    @staticmethod
    def parent(headers: Mapping[str, Any] | None, *, prefer_current: bool) -> otel_context.Context:
        """Return the context a span should continue.

        The current span (FastStream's process span) when there is one and
        ``prefer_current``; otherwise what the message's headers carry. A hostile
        header yields a fresh root, never an error.
        """
        if prefer_current and trace.get_current_span().get_span_context().is_valid:
            return otel_context.get_current()
        try:
            return propagate.extract(headers or {}, context=otel_context.Context(), getter=_GETTER)
        except Exception:  # untrusted input: a broken traceparent starts a new trace
            return otel_context.Context()

    @contextlib.contextmanager
    def step(
        self,
        name: str,
        incoming: Mapping[str, Any] | None,
        outgoing: dict[str, Any],
        attributes: Mapping[str, Any],
        *,
        prefer_current: bool,
    ) -> Iterator[trace.Span | None]:
        """Run one step (a publish of a copy) in a PRODUCER span, when tracing is on.

        The span continues ``incoming``'s trace (or the current span, see
        ``parent``) and its context is injected into ``outgoing``, the copy's
        headers. ``attributes`` name the broker (``ATTR.SYSTEM``; ``rabbitmq`` when
        they do not). With tracing off it yields ``None`` and touches nothing.
        """
        if not self.tracing:
            yield None
            return
        parent = self.parent(incoming, prefer_current=prefer_current)
        span = self.tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes={ATTR.SYSTEM: RABBITMQ, **attributes},
            record_exception=False,
            set_status_on_exception=False,
        )
        # Not made current: nothing in the step reads the current span, and attaching
        # and detaching a context per step was half of a span's cost under a burst.
        try:
            propagate.inject(outgoing, context=trace.set_span_in_context(span, parent))
            yield span
        finally:
            span.end()

    def start_outage(self, name: str, attributes: Mapping[str, Any]) -> trace.Span | None:
        """Start the span of an outage, a trace of its own; ``None`` with tracing off.

        It outlives any one message, so it is not made current. It links the current
        span, when there is one: that of the failure that switched the queue.
        """
        if not self.tracing:
            return None
        current = trace.get_current_span().get_span_context()
        return self.tracer.start_span(
            name,
            context=otel_context.Context(),
            kind=SpanKind.INTERNAL,
            attributes={ATTR.SYSTEM: RABBITMQ, **attributes},
            links=[trace.Link(current)] if current.is_valid else None,
            record_exception=False,
            set_status_on_exception=False,
        )

    @staticmethod
    def fail(span: trace.Span, description: str) -> None:
        """Mark ``span`` as failed."""
        span.set_status(Status(StatusCode.ERROR, description))
