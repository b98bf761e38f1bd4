"""One reporting path: every step feeds its span, the metrics, the log and the hooks.

A step is a retry scheduled, a re-check hop, a release or a dead letter; a queue going
into outage mode and out of it takes the same path (``Reporter.outage``). The middleware
and the re-check consumer describe it as a ``RetryEvent`` plus the copy it publishes, and
``Reporter.publish`` does the rest, the same way for both: the copy is published inside
the step's span (whose context it carries on), the span is marked failed when the copy
was not confirmed or the message was dead-lettered, and only a confirmed step is counted,
logged and handed to the hooks.

Reporting never decides a message's fate. The span, the metrics, the log line and the
hooks are each on their own: one of them raising (an exporter down, a log filter that
raises, an exception whose ``str()`` raises when the span records it) is logged, the
others still run, and the copy is published and settled exactly as without it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.core.config import traceback_on_retry
from faststream_retry.core.durations import format_ms
from faststream_retry.core.events import EventKind, RetryEvent, RetryHook
from faststream_retry.core.topology import dlq_name, retry_queue_name
from faststream_retry.reporting.log import log
from faststream_retry.reporting.telemetry import ATTR

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence

    from opentelemetry.trace import Span

    from faststream_retry.core.steps import Copy
    from faststream_retry.reporting.telemetry import Telemetry

__all__ = ["Reporter", "emit"]

_SPAN_SUFFIX = {
    EventKind.SCHEDULED: "retry scheduled",
    EventKind.HOP: "retry hop",
    EventKind.RELEASED: "retry release",
    EventKind.DEAD_LETTERED: "dead-letter",
}


class Reporter:
    """Reports steps; holds the telemetry and the hooks of one middleware (or worker)."""

    def __init__(
        self,
        telemetry: Telemetry,
        hooks: Sequence[RetryHook],
        *,
        log_retry_traceback: str = "first",
    ) -> None:
        """Report to ``telemetry`` and ``hooks`` (a live sequence: hooks may come and go).

        ``log_retry_traceback`` says which retry lines carry the traceback (see
        ``RetryMiddleware``); a dead letter's line always does.
        """
        self.telemetry = telemetry
        self.hooks = hooks
        self.log_retry_traceback = log_retry_traceback
        self._warned: set[object] = set()

    async def publish(
        self,
        event: RetryEvent,
        copy: Copy,
        send: Callable[[Copy], Awaitable[bool]],
        *,
        incoming: Mapping[str, Any] | None,
        exception: BaseException | None = None,
        tier_ms: int | None = None,
    ) -> bool:
        """Send ``copy`` inside the step's span; report the step once it is confirmed.

        A handler's failure (``event.classification`` set) continues the current span,
        FastStream's process span when there is one; a re-check step continues the
        trace the message carries. Returns whether the copy was confirmed. Only
        ``send`` decides that: the span and the report cannot fail the step.
        """
        if not self.telemetry.tracing:
            ok = await send(copy)
        else:
            attributes = _span_attributes(event, copy, tier_ms)
            with self._step(event, incoming, copy.headers, attributes) as span:
                if span is not None and exception is not None:
                    _record_exception(span, exception, event)
                ok = await send(copy)
                if span is not None and not ok:
                    original = "original" if event.classification is not None else "message"
                    _guarded(
                        "mark the span of",
                        event,
                        self.telemetry.fail,
                        span,
                        f"the copy was not confirmed; the {original} is kept",
                    )
                elif span is not None and event.kind is EventKind.DEAD_LETTERED:
                    _guarded(
                        "mark the span of",
                        event,
                        self.telemetry.fail,
                        span,
                        _dead_letter_status(event),
                    )
        if ok:
            self.report(event, exception)
        return ok

    def record(
        self,
        event: RetryEvent,
        *,
        incoming: Mapping[str, Any] | None,
        exception: BaseException | None = None,
        onward: dict[str, Any] | None = None,
    ) -> None:
        """Report a step that publishes nothing; never raises.

        An in-process retry, test mode, or a release the broker made (a copy that
        expired out of its last tier into its work queue). ``onward`` gets the
        span's context: the delivery's own headers for a release, so the handler's
        call and its next retry continue the trace from it.
        """
        if event.immediate or event.kind is EventKind.RELEASED:
            attributes = _span_attributes(event, None, None)
            carrier = onward if onward is not None else {}
            with self._step(event, incoming, carrier, attributes) as span:
                if span is not None and exception is not None:
                    _record_exception(span, exception, event)
        self.report(event, exception)

    @contextlib.contextmanager
    def _step(
        self,
        event: RetryEvent,
        incoming: Mapping[str, Any] | None,
        outgoing: dict[str, Any],
        attributes: Mapping[str, Any],
    ) -> Iterator[Span | None]:
        """Run the body in the step's span; a span that cannot start or end is only logged."""
        step = self.telemetry.step(
            f"{event.queue} {_SPAN_SUFFIX[event.kind]}",
            incoming,
            outgoing,
            attributes,
            prefer_current=event.classification is not None,
        )
        try:
            span = step.__enter__()
        except Exception as problem:  # a broken tracer or propagator: no span, same step
            _log_broken("start the span of", event, problem)
            yield None
            return
        try:
            yield span
        finally:
            _guarded("end the span of", event, step.__exit__, None, None, None)

    def report(self, event: RetryEvent, exception: BaseException | None = None) -> None:
        """Count, log and hand ``event`` to the hooks; never raises.

        The step has happened when this runs (its copy is confirmed): a broken meter
        or log handler must not make the caller requeue a message already copied,
        and none of the three keeps the others from running. ``exception`` is the
        handler's failure, whose traceback the log line shows.
        """
        _guarded("count", event, self._count, event)
        _guarded("log", event, self._log, event, exception)
        if self.hooks:  # events go nowhere when nobody listens
            _guarded("hand to the hooks", event, emit, self.hooks, event)

    def outage(
        self,
        event: RetryEvent,
        span: Span | None = None,
        *,
        after: int = 0,
    ) -> Span | None:
        """Report a queue going into outage mode (``OUTAGE_STARTED``) or out of it; never raises.

        Going in starts the outage's span (a trace of its own, linked from the span of
        the failure that switched it; ``after`` is the ``outage_after`` option),
        returned to be passed back when it ends. Coming out ends that span.
        Both are counted, logged and handed to the hooks as every step is.
        """
        if event.kind is EventKind.OUTAGE_STARTED:
            try:
                span = self.telemetry.start_outage(
                    f"{event.queue} outage", _outage_start_attributes(event, after)
                )
                if span is not None and event.exception is not None:
                    span.add_event(
                        "exception",
                        {
                            ATTR.EXCEPTION_TYPE: event.exception,
                            ATTR.EXCEPTION_MESSAGE: event.error or "",
                        },
                    )
            except Exception as problem:  # a broken tracer: no span, same outage
                _log_broken("start the span of", event, problem)
        elif span is not None:
            _guarded("end the span of", event, _end_outage_span, span, event)
            span = None
        self.report(event)
        return span

    def count_probe(self, queue: str) -> None:
        """Count a message let through as a probe; never raises."""
        with contextlib.suppress(Exception):  # a broken meter must not hold the gate
            self.telemetry.outage_probes.add(1, {ATTR.QUEUE: queue})

    def count_requeued(self, queue: str) -> None:
        """Count a held message requeued; never raises."""
        with contextlib.suppress(Exception):  # a broken meter must not keep the message
            self.telemetry.outage_requeued.add(1, {ATTR.QUEUE: queue})

    def warn_once(self, key: object, message: str, *args: object) -> None:
        """Log ``message`` at WARNING the first time ``key`` comes; never raises."""
        if key in self._warned:
            return
        self._warned.add(key)
        with contextlib.suppress(Exception):  # a log filter or handler that raises
            log.warning(message, *args)

    def _count(self, event: RetryEvent) -> None:
        telemetry = self.telemetry
        kind = event.kind
        labels = {ATTR.QUEUE: event.queue} if kind is not EventKind.HOP else {}
        if event.classification is not None:
            telemetry.failures.add(1, labels | {ATTR.CLASSIFICATION: str(event.classification)})
        if kind is EventKind.SCHEDULED:
            telemetry.scheduled.add(1, labels | {ATTR.RULE: str(event.rule)})
            telemetry.planned_delay.record(event.delay_ms or 0, labels)
        elif kind is EventKind.DEAD_LETTERED:
            telemetry.dead_lettered.add(1, labels | {ATTR.REASON: str(event.reason)})
        elif kind is EventKind.RELEASED:
            telemetry.released.add(1, labels)
            if event.lateness_ms is not None:
                telemetry.lateness.record(event.lateness_ms, labels)
        elif kind is EventKind.OUTAGE_STARTED:
            telemetry.outage_entered.add(1, labels)
            telemetry.outage_active.add(1, labels)
        elif kind is EventKind.OUTAGE_ENDED:
            telemetry.outage_active.add(-1, labels)
            telemetry.outage_duration.record(event.duration_ms or 0, labels)

    def _log(self, event: RetryEvent, exception: BaseException | None) -> None:
        kind = event.kind
        if kind is EventKind.SCHEDULED:
            with_traceback = traceback_on_retry(self.log_retry_traceback, event.attempt)
            log.info(
                "retry scheduled for message %s from %s: attempt=%d/%d delay=%dms "
                "rule=%s error=%s: %s",
                event.message_id,
                event.queue,
                event.attempt,
                event.max_attempts,
                event.delay_ms or 0,
                event.rule,
                event.exception,
                event.error,
                exc_info=exception if with_traceback else None,
                extra=_log_fields(event),
            )
        elif kind is EventKind.DEAD_LETTERED:
            log.error(
                "dead-lettered message %s from %s to %s: reason=%s attempt=%d/%s error=%s: %s",
                event.message_id,
                event.queue,
                dlq_name(event.queue),
                event.reason,
                event.attempt,
                event.max_attempts or "?",
                event.exception,
                event.error,
                exc_info=exception,
                extra=_log_fields(event),
            )
        elif kind is EventKind.OUTAGE_STARTED:
            log.warning(
                "faststream-retry: %s is in outage mode after %d consecutive transient "
                "failures (last: %s: %s); taking one message per %s until one succeeds",
                event.queue,
                event.failures or 0,
                event.exception,
                event.error,
                _duration(event.delay_ms or 0),
                extra=_outage_log_fields(event),
            )
        elif kind is EventKind.OUTAGE_ENDED:
            # WARNING like the line that began it: whoever saw that one sees this one.
            if event.message_id is None:
                log.warning(
                    "faststream-retry: %s was in outage mode for %s when its consumer "
                    "stopped (%d probes); the messages it held were requeued",
                    event.queue,
                    _duration(event.duration_ms or 0),
                    event.probes or 0,
                    extra=_outage_log_fields(event),
                )
            else:
                log.warning(
                    "faststream-retry: %s left outage mode after %s: message %s succeeded "
                    "(%d probes, %d transient failures meanwhile); full speed again",
                    event.queue,
                    _duration(event.duration_ms or 0),
                    event.message_id,
                    event.probes or 0,
                    event.failures or 0,
                    extra=_outage_log_fields(event),
                )
        # Hops and releases are the noisy path: never above DEBUG, and no work for the
        # line unless DEBUG is on.
        elif log.isEnabledFor(logging.DEBUG):
            log.debug(
                "re-check %s message %s from %s (due %s)",
                kind,
                event.message_id,
                retry_queue_name(event.queue),
                event.due_ms,
                extra=_log_fields(event),
            )


def _duration(ms: int) -> str:
    """Return ``ms`` as a log line says it: ``250 ms``, ``1.5 s``, ``12 min 5 s``."""
    return format_ms(ms)


def _outage_start_attributes(event: RetryEvent, after: int) -> dict[str, Any]:
    return {
        ATTR.QUEUE: event.queue,
        ATTR.OUTAGE_AFTER: after,
        ATTR.OUTAGE_PROBE_MS: event.delay_ms or 0,
        ATTR.MESSAGE_ID: event.message_id or "",
    }


def _end_outage_span(span: Span, event: RetryEvent) -> None:
    span.set_attributes(
        {
            ATTR.OUTAGE_FAILURES: event.failures or 0,
            ATTR.OUTAGE_PROBE_COUNT: event.probes or 0,
            ATTR.OUTAGE_DURATION_MS: event.duration_ms or 0,
            ATTR.OUTAGE_END: "stopped" if event.message_id is None else "success",
        }
    )
    span.end()


def emit(hooks: Sequence[RetryHook], event: RetryEvent) -> None:
    """Call every hook; a failing hook is logged and never disturbs the message."""
    for hook in hooks:
        try:
            hook(event)
        except Exception:  # noqa: PERF203 - a user's hook must never lose or stall a message
            log.exception("faststream-retry hook %r failed on %s", hook, event.kind)


def _guarded(what: str, event: RetryEvent, call: Callable[..., object], *args: object) -> None:
    """Call ``call(*args)``; if it raises, log that reporting ``event`` failed, and go on."""
    try:
        call(*args)
    except Exception as problem:  # see the module docstring: reporting never decides a fate
        _log_broken(what, event, problem)


def _log_broken(what: str, event: RetryEvent, problem: Exception) -> None:
    with contextlib.suppress(Exception):  # the log handler may be what is broken
        log.error(
            "faststream-retry could not %s %s of message %s",
            what,
            event.kind,
            event.message_id,
            exc_info=problem,
        )


def _record_exception(span: Span, exception: BaseException, event: RetryEvent) -> None:
    """Record ``exception`` on ``span``; OpenTelemetry's own record calls ``str()`` on it."""
    try:
        span.record_exception(exception)
    except Exception:  # its str() or traceback raised: record what can be said safely
        _guarded(
            "record the exception on the span of",
            event,
            span.add_event,
            "exception",
            {
                "exception.type": h.exception_name(exception),
                "exception.message": h.error_text(exception),
                "exception.stacktrace": h.traceback_text(exception),
                "exception.escaped": "False",
            },
        )


def _dead_letter_status(event: RetryEvent) -> str:
    if event.classification is None:  # the re-check consumer's verdict on a header
        return f"dead-lettered: {event.reason} retry-due"
    return f"dead-lettered: {event.reason}"


def _span_attributes(event: RetryEvent, copy: Copy | None, tier_ms: int | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        ATTR.QUEUE: event.queue,
        ATTR.MESSAGE_ID: event.message_id or "",
        ATTR.ATTEMPT: event.attempt,
    }
    if event.classification is not None:  # a handler failed
        attributes |= {
            ATTR.MAX_ATTEMPTS: event.max_attempts,
            ATTR.CLASSIFICATION: str(event.classification),
            ATTR.RULE: str(event.rule),
            ATTR.DELAY_MS: event.delay_ms or 0,
        }
    else:  # a re-check step
        attributes[ATTR.NOW_MS] = event.at_ms
        if event.due_ms is not None:
            attributes[ATTR.DUE_MS] = event.due_ms
            attributes[ATTR.REMAINING_MS] = event.due_ms - event.at_ms
    kind = event.kind
    if event.immediate:
        attributes[ATTR.IMMEDIATE] = True
    elif kind is EventKind.SCHEDULED:
        attributes |= {ATTR.DUE_MS: event.due_ms, ATTR.TIER_MS: tier_ms}
    elif kind is EventKind.HOP:
        attributes[ATTR.TIER_MS] = event.delay_ms
    elif kind is EventKind.RELEASED:
        attributes[ATTR.LATENESS_MS] = event.lateness_ms or 0
    elif kind is EventKind.DEAD_LETTERED and copy is not None:
        attributes |= {ATTR.REASON: str(event.reason), ATTR.DLQ: copy.routing_key}
    if copy is not None:
        attributes[ATTR.DESTINATION] = copy.exchange or copy.routing_key
        attributes[ATTR.ROUTING_KEY] = copy.routing_key
    return attributes


def _log_fields(event: RetryEvent) -> dict[str, Any]:
    """Fields for structured log handlers (JSON formatters read ``record.retry``).

    ``queue`` and ``message_id`` fill the columns of FastStream's broker logger.
    """
    return {
        "queue": event.queue,
        "message_id": event.message_id or "",
        "retry": {
            "event": str(event.kind),
            "queue": event.queue,
            "message_id": event.message_id,
            "attempt": event.attempt,
            "max_attempts": event.max_attempts,
            "delay_ms": event.delay_ms,
            "reason": None if event.reason is None else str(event.reason),
            "exception": event.exception,
            "rule": None if event.rule is None else str(event.rule),
        },
    }


def _outage_log_fields(event: RetryEvent) -> dict[str, Any]:
    """``_log_fields`` plus what an outage line says: failures, probes, duration."""
    fields = _log_fields(event)
    fields["retry"] |= {
        "failures": event.failures,
        "probes": event.probes,
        "duration_ms": event.duration_ms,
    }
    return fields
