"""One reporting path: every step feeds its span, the metrics, the log and the hooks.

A step is a retry scheduled, a re-check hop, a release or a dead letter; a queue going
into outage mode and out of it takes the same path (``Reporter.outage``). The middleware
and the re-check consumer describe it as a ``RetryEvent`` plus the copy it publishes, and
``Reporter.publish`` does the rest, the same way for both: the copy is published inside
the step's span (whose context it carries on), the span is marked failed when the copy
was not confirmed or the message was dead-lettered, and only a confirmed step is counted,
logged and handed to the hooks. What each kind of event's span carries, what it counts
and what its log line says are rows of ``spans``, ``metrics`` and ``lines``: the reporter
only drives them.

Reporting never decides a message's fate. The span, the metrics, the log line and the
hooks are each on their own: one of them raising (an exporter down, a log filter that
raises, an exception whose ``str()`` raises when the span records it) is logged, the
others still run, and the copy is published and settled exactly as without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.core.events import EventKind, RetryEvent, RetryHook
from faststream_retry.reporting import lines, metrics, spans
from faststream_retry.reporting.log import log
from faststream_retry.reporting.telemetry import ATTR, RABBITMQ

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence

    from opentelemetry.trace import Span

    from faststream_retry.core.decision import Decision
    from faststream_retry.core.steps import Copy
    from faststream_retry.reporting.telemetry import Telemetry

__all__ = ["Reporter", "emit"]


class Reporter:
    """Reports steps; holds the telemetry and the hooks of one middleware (or worker)."""

    def __init__(
        self,
        telemetry: Telemetry,
        hooks: Sequence[RetryHook],
        *,
        log_retry_traceback: str = "first",
        system: str = RABBITMQ,
    ) -> None:
        """Report to ``telemetry`` and ``hooks`` (a live sequence: hooks may come and go).

        ``log_retry_traceback`` says which retry lines carry the traceback (see
        ``RetryMiddleware``); a dead letter's line always does. ``system`` is the
        ``messaging.system`` of the spans (``on``).
        """
        self.telemetry = telemetry
        self.hooks = hooks
        self.log_retry_traceback = log_retry_traceback
        self.system = system
        self._warned: set[object] = set()

    def on(self, system: str) -> Reporter:
        """Return this reporter for the runtime of one broker: its spans say ``system``.

        The same telemetry, hooks and once-only warnings: one middleware on a
        ``RabbitBroker`` and a ``NatsBroker`` reports through one set of instruments,
        and each runtime says which broker its spans are about (``rabbitmq``, ``nats``,
        ``redis``: data the runtime passes, never a broker import here).
        """
        if system == self.system:
            return self
        other = Reporter(
            self.telemetry, self.hooks, log_retry_traceback=self.log_retry_traceback, system=system
        )
        other._warned = self._warned  # one middleware warns once, whichever broker
        return other

    async def publish(
        self,
        event: RetryEvent,
        copy: Copy,
        send: Callable[[Copy], Awaitable[bool]],
        *,
        incoming: Mapping[str, Any] | None,
        exception: BaseException | None = None,
        tier_ms: int | None = None,
        destination: str | None = None,
    ) -> bool:
        """Send ``copy`` inside the step's span; report the step once it is confirmed.

        A handler's failure (``event.classification`` set) continues the current span,
        FastStream's process span when there is one; a re-check step continues the
        trace the message carries. Returns whether the copy was confirmed. Only
        ``send`` decides that: the span and the report cannot fail the step.
        ``destination``: where ``send`` publishes on this broker (a NATS subject, a
        Redis key); ``None``: RabbitMQ's, ``copy``'s exchange or queue. A dead letter's
        is where the letter is: the event's ``dlq`` says it, in the span, the log line
        and the hooks (the core names RabbitMQ's ``<queue>.dlq``, which on NATS and Redis
        is nowhere).
        """
        if destination is not None and event.kind is EventKind.DEAD_LETTERED:
            event = dataclasses.replace(event, dlq=destination)
        if not self.telemetry.tracing:
            ok = await send(copy)
        else:
            attributes = spans.step_attributes(
                event, copy, tier_ms, system=self.system, destination=destination
            )
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
                elif span is not None and (status := spans.failed_status(event)) is not None:
                    _guarded("mark the span of", event, self.telemetry.fail, span, status)
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
        # With tracing off there is no span to make (one release per retry under a burst).
        if (event.immediate or event.kind is EventKind.RELEASED) and self.telemetry.tracing:
            attributes = spans.step_attributes(event, None, None, system=self.system)
            carrier = onward if onward is not None else {}
            with self._step(event, incoming, carrier, attributes) as span:
                if span is not None and exception is not None:
                    _record_exception(span, exception, event)
        self.report(event, exception)

    def in_process(
        self,
        queue: str,
        message_id: str,
        headers: Mapping[str, Any] | None,
        decision: Decision,
        exc: BaseException,
        *,
        immediate: bool,
    ) -> None:
        """Report a retry made in the process, with no copy (``core.steps.in_process``)."""
        event = steps.in_process(queue, message_id, decision, exc, h.now_ms(), immediate=immediate)
        self.record(event, incoming=headers, exception=exc)

    @contextlib.contextmanager
    def _step(
        self,
        event: RetryEvent,
        incoming: Mapping[str, Any] | None,
        outgoing: dict[str, Any],
        attributes: Mapping[str, Any],
    ) -> Iterator[Span | None]:
        """Run the body in the step's span; a span that cannot start or end is only logged."""
        step = spans.step(self.telemetry, event, incoming, outgoing, attributes)
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
        _guarded("count", event, metrics.count, self.telemetry, event)
        _guarded("log", event, lines.write, event, exception, self.log_retry_traceback)
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
                span = spans.start_outage(self.telemetry, event, after, system=self.system)
            except Exception as problem:  # a broken tracer: no span, same outage
                _log_broken("start the span of", event, problem)
        elif span is not None:
            _guarded("end the span of", event, spans.end_outage, span, event)
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
        self._once(logging.WARNING, key, message, *args)

    def error_once(self, key: object, message: str, *args: object) -> None:
        """Log ``message`` at ERROR the first time ``key`` comes; never raises."""
        self._once(logging.ERROR, key, message, *args)

    def _once(self, level: int, key: object, message: str, *args: object) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        with contextlib.suppress(Exception):  # a log filter or handler that raises
            log.log(level, message, *args)


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
    """Record ``exception`` on ``span``; if even the safe fallback raises, only log it."""
    _guarded("record the exception on the span of", event, spans.record_exception, span, exception)
