"""What each event's log line says: one row per ``EventKind`` in ``LINES``.

A retry is an INFO line, a dead letter an ERROR line with its traceback, outage mode's
start and end a WARNING each; re-check hops and releases are the noisy path, at DEBUG
and only built when DEBUG is on. Every line goes through the plugin's logger
(``reporting.log``), with the event's fields for structured handlers (``record.retry``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from faststream_retry.core.config import traceback_on_retry
from faststream_retry.core.durations import format_ms
from faststream_retry.core.events import EventKind, RetryEvent
from faststream_retry.core.topology import dlq_name, retry_queue_name
from faststream_retry.errors import RetryLater
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["LINES", "write"]


def write(
    event: RetryEvent,
    exception: BaseException | None,
    retry_traceback: str,
) -> None:
    """Write ``event``'s line; ``exception`` is the handler's failure, for the traceback.

    ``retry_traceback`` is ``log_retry_traceback`` (``first``, ``every``, ``never``):
    which retry lines carry the traceback; a dead letter's always does.
    """
    LINES[event.kind](event, exception, retry_traceback)


def _scheduled(
    event: RetryEvent,
    exception: BaseException | None,
    retry_traceback: str,
) -> None:
    if not log.isEnabledFor(logging.INFO):  # one per failure: no work for a line not written
        return
    log.info(
        "retry scheduled for message %s from %s: attempt=%d/%d delay=%dms rule=%s error=%s: %s",
        event.message_id,
        event.queue,
        event.attempt,
        event.max_attempts,
        event.delay_ms or 0,
        event.rule,
        event.exception,
        event.error,
        # A RetryLater is the handler saying when, not a failure: its line is enough.
        exc_info=exception
        if traceback_on_retry(retry_traceback, event.attempt)
        and not isinstance(exception, RetryLater)
        else None,
        extra=_fields(event),
    )


def _recheck(event: RetryEvent, _: BaseException | None, __: str) -> None:
    # A hop or a release: never above DEBUG, and no work for the line unless DEBUG is on.
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "re-check %s message %s from %s (due %s)",
            event.kind,
            event.message_id,
            retry_queue_name(event.queue),
            event.due_ms,
            extra=_fields(event),
        )


def _dead_lettered(event: RetryEvent, exception: BaseException | None, _: str) -> None:
    # Where the letter is on its broker (a Redis key, a NATS subject): what the transport
    # said, else RabbitMQ's <queue>.dlq.
    dlq = event.dlq or dlq_name(event.queue)
    fields = _fields(event)
    fields["retry"]["dlq"] = dlq
    log.error(
        "dead-lettered message %s from %s to %s: reason=%s attempt=%d/%s error=%s: %s",
        event.message_id,
        event.queue,
        dlq,
        event.reason,
        event.attempt,
        event.max_attempts or "?",
        event.exception,
        event.error,
        exc_info=exception,
        extra=fields,
    )


def _outage_started(event: RetryEvent, _: BaseException | None, __: str) -> None:
    log.warning(
        "faststream-retry: %s is in outage mode after %d consecutive transient "
        "failures (last: %s: %s); taking one message per %s until one succeeds",
        event.queue,
        event.failures or 0,
        event.exception,
        event.error,
        format_ms(event.delay_ms or 0),
        extra=_outage_fields(event),
    )


def _outage_ended(event: RetryEvent, _: BaseException | None, __: str) -> None:
    # WARNING like the line that began it: whoever saw that one sees this one.
    if event.message_id is None:
        log.warning(
            "faststream-retry: %s was in outage mode for %s when its consumer "
            "stopped (%d probes); the messages it held were requeued",
            event.queue,
            format_ms(event.duration_ms or 0),
            event.probes or 0,
            extra=_outage_fields(event),
        )
    else:
        log.warning(
            "faststream-retry: %s left outage mode after %s: message %s succeeded "
            "(%d probes, %d transient failures meanwhile); full speed again",
            event.queue,
            format_ms(event.duration_ms or 0),
            event.message_id,
            event.probes or 0,
            event.failures or 0,
            extra=_outage_fields(event),
        )


LINES: Mapping[
    EventKind,
    Callable[[RetryEvent, BaseException | None, str], None],
] = {
    EventKind.SCHEDULED: _scheduled,
    EventKind.HOP: _recheck,
    EventKind.RELEASED: _recheck,
    EventKind.DEAD_LETTERED: _dead_lettered,
    EventKind.OUTAGE_STARTED: _outage_started,
    EventKind.OUTAGE_ENDED: _outage_ended,
}
"""Each kind's line; a kind without a row here fails ``tests/unit/test_reporting.py``."""


def _fields(event: RetryEvent) -> dict[str, Any]:
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


def _outage_fields(event: RetryEvent) -> dict[str, Any]:
    """``_fields`` plus what an outage line says: failures, probes, duration."""
    fields = _fields(event)
    fields["retry"] |= {
        "failures": event.failures,
        "probes": event.probes,
        "duration_ms": event.duration_ms,
    }
    return fields
