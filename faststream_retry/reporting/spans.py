"""What each event's span is called and carries: one row per ``EventKind`` in ``SPANS``.

Span names follow the messaging convention ``<destination> <operation>``:

==============================  =========================================================
``<queue> retry scheduled``     a transient failure sent into the delay tiers (or, with
                                ``faststream_retry.immediate``, retried in-process)
``<queue> retry hop``           the re-check consumer sent a message round a tier again
``<queue> retry release``       the re-check consumer republished a due message
``<queue> dead-letter``         the message went to its dead letters (status ERROR)
``<queue> outage``              (INTERNAL, a trace of its own) the queue was in outage mode:
                                from the failure that switched it to the success that ended
                                it (``faststream_retry.outage.*`` attributes)
==============================  =========================================================

A step (the first four) is a PRODUCER span around the publish of its copy
(``Telemetry.step``); an outage is one span from ``OUTAGE_STARTED`` to ``OUTAGE_ENDED``
(``start_outage``, ``end_outage``). This module only says what goes on them; the
reporter decides when, and keeps a broken span from touching the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.core.events import EventKind, RetryEvent
from faststream_retry.reporting.log import traceback_of
from faststream_retry.reporting.telemetry import ATTR, RABBITMQ

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from contextlib import AbstractContextManager

    from opentelemetry.trace import Span

    from faststream_retry.core.steps import Copy
    from faststream_retry.reporting.telemetry import Telemetry

__all__ = [
    "SPANS",
    "SpanRow",
    "end_outage",
    "failed_status",
    "record_exception",
    "start_outage",
    "step",
    "step_attributes",
]


@dataclass(frozen=True, slots=True)
class SpanRow:
    """The span of one kind of event."""

    operation: str
    """Its name after the queue's: ``<queue> <operation>``."""
    attributes: Callable[[dict[str, Any], RetryEvent, Copy | None, int | None], None] | None
    """Adds what a step of this kind carries beyond every step's attributes (given the
    copy and the tier, when there are); ``None``: not a step (an outage)."""
    failed: Callable[[RetryEvent], str] | None = None
    """The status of a step of this kind that happened, which is an error all the same
    (a dead letter); ``None``: its span is failed only when its copy is not confirmed."""


def _scheduled(
    attributes: dict[str, Any], event: RetryEvent, _: Copy | None, tier_ms: int | None
) -> None:
    if event.immediate:  # retried in the process: no tier, no due time
        attributes[ATTR.IMMEDIATE] = True
    else:
        attributes[ATTR.DUE_MS] = event.due_ms
        attributes[ATTR.TIER_MS] = tier_ms


def _hop(attributes: dict[str, Any], event: RetryEvent, _: Copy | None, __: int | None) -> None:
    attributes[ATTR.TIER_MS] = event.delay_ms


def _released(
    attributes: dict[str, Any], event: RetryEvent, _: Copy | None, __: int | None
) -> None:
    attributes[ATTR.LATENESS_MS] = event.lateness_ms or 0


def _dead_lettered(
    attributes: dict[str, Any], event: RetryEvent, copy: Copy | None, _: int | None
) -> None:
    if copy is not None:
        attributes[ATTR.REASON] = str(event.reason)
        attributes[ATTR.DLQ] = event.dlq or copy.routing_key


def _dead_letter_status(event: RetryEvent) -> str:
    if event.classification is None:  # the re-check consumer's verdict on a header
        return f"dead-lettered: {event.reason} retry-due"
    return f"dead-lettered: {event.reason}"


SPANS: Mapping[EventKind, SpanRow] = {
    EventKind.SCHEDULED: SpanRow("retry scheduled", _scheduled),
    EventKind.HOP: SpanRow("retry hop", _hop),
    EventKind.RELEASED: SpanRow("retry release", _released),
    EventKind.DEAD_LETTERED: SpanRow("dead-letter", _dead_lettered, _dead_letter_status),
    EventKind.OUTAGE_STARTED: SpanRow("outage", None),
    EventKind.OUTAGE_ENDED: SpanRow("outage", None),
}
"""Every kind's span; a kind without a row here fails ``tests/unit/test_reporting.py``."""


def step_attributes(
    event: RetryEvent,
    copy: Copy | None,
    tier_ms: int | None,
    *,
    system: str = RABBITMQ,
    destination: str | None = None,
) -> dict[str, Any]:
    """Return the attributes of ``event``'s step span: ``copy`` is what it publishes, if any.

    ``tier_ms`` is the tier a scheduled copy goes round. ``system`` is the broker's
    ``messaging.system``; ``destination`` where the copy is published on it (a NATS
    subject, a Redis key), or ``None``: on RabbitMQ, the copy's exchange, or its queue
    by the default exchange, with the routing key beside it.
    """
    attributes: dict[str, Any] = {
        ATTR.SYSTEM: system,
        ATTR.QUEUE: event.queue,
        ATTR.MESSAGE_ID: event.message_id or "",
        ATTR.ATTEMPT: event.attempt,
    }
    if event.classification is not None:  # a handler failed
        attributes[ATTR.MAX_ATTEMPTS] = event.max_attempts
        attributes[ATTR.CLASSIFICATION] = str(event.classification)
        attributes[ATTR.RULE] = str(event.rule)
        attributes[ATTR.DELAY_MS] = event.delay_ms or 0
    else:  # a re-check step
        attributes[ATTR.NOW_MS] = event.at_ms
        if event.due_ms is not None:
            attributes[ATTR.DUE_MS] = event.due_ms
            attributes[ATTR.REMAINING_MS] = event.due_ms - event.at_ms
    own = SPANS[event.kind].attributes
    if own is not None:
        own(attributes, event, copy, tier_ms)
    if destination is not None:
        attributes[ATTR.DESTINATION] = destination
    elif copy is not None:
        attributes[ATTR.DESTINATION] = copy.exchange or copy.routing_key
    if copy is not None and system == RABBITMQ:
        attributes[ATTR.ROUTING_KEY] = copy.routing_key
    return attributes


def step(
    telemetry: Telemetry,
    event: RetryEvent,
    incoming: Mapping[str, Any] | None,
    outgoing: dict[str, Any],
    attributes: Mapping[str, Any],
) -> AbstractContextManager[Span | None]:
    """Return ``event``'s step span, not started yet (``Telemetry.step``).

    A handler's failure (``event.classification`` set) continues the current span,
    FastStream's process span when there is one; a re-check step continues the trace
    ``incoming`` carries.
    """
    return telemetry.step(
        f"{event.queue} {SPANS[event.kind].operation}",
        incoming,
        outgoing,
        attributes,
        prefer_current=event.classification is not None,
    )


def failed_status(event: RetryEvent) -> str | None:
    """Return the error status of ``event``'s span although its copy was confirmed, if any."""
    failed = SPANS[event.kind].failed
    return None if failed is None else failed(event)


def record_exception(span: Span, exception: BaseException) -> None:
    """Record ``exception`` on ``span`` as OpenTelemetry's ``record_exception`` would.

    Not by it: it formats the whole traceback again for every failure (under a burst
    with tracing on, more than the copy's publish costs), and calls ``str()`` on the
    exception unguarded. The stack trace is the log line's (``traceback_of``: its
    frames formatted once per place of failure), the message ``error_text``'s.
    """
    span.add_event(
        "exception",
        {
            "exception.type": h.exception_name(exception),
            "exception.message": h.error_text(exception),
            "exception.stacktrace": traceback_of(exception),
            "exception.escaped": "False",
        },
    )


def start_outage(
    telemetry: Telemetry, event: RetryEvent, after: int, *, system: str = RABBITMQ
) -> Span | None:
    """Start the span of the outage ``event`` (``OUTAGE_STARTED``) begins; ``None`` untraced.

    ``after`` is the ``outage_after`` option, ``system`` the broker's ``messaging.system``.
    The failure that switched the queue is recorded on it as an exception event.
    """
    span = telemetry.start_outage(
        f"{event.queue} {SPANS[event.kind].operation}",
        {
            ATTR.SYSTEM: system,
            ATTR.QUEUE: event.queue,
            ATTR.OUTAGE_AFTER: after,
            ATTR.OUTAGE_PROBE_MS: event.delay_ms or 0,
            ATTR.MESSAGE_ID: event.message_id or "",
        },
    )
    if span is not None and event.exception is not None:
        span.add_event(
            "exception",
            {ATTR.EXCEPTION_TYPE: event.exception, ATTR.EXCEPTION_MESSAGE: event.error or ""},
        )
    return span


def end_outage(span: Span, event: RetryEvent) -> None:
    """End the outage's ``span`` with what ``event`` (``OUTAGE_ENDED``) says it took."""
    span.set_attributes(
        {
            ATTR.OUTAGE_FAILURES: event.failures or 0,
            ATTR.OUTAGE_PROBE_COUNT: event.probes or 0,
            ATTR.OUTAGE_DURATION_MS: event.duration_ms or 0,
            ATTR.OUTAGE_END: "stopped" if event.message_id is None else "success",
        }
    )
    span.end()
