"""What each event counts: one row per ``EventKind`` in ``COUNTS``.

The instruments are ``Telemetry``'s (their names are ``METRICS``); every point carries
the queue (``faststream_retry.queue``). A handler's failure is also counted by its
classification, whatever became of the message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faststream_retry.core.events import EventKind, RetryEvent
from faststream_retry.reporting.telemetry import ATTR

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from faststream_retry.reporting.telemetry import Telemetry

__all__ = ["COUNTS", "count"]


def count(telemetry: Telemetry, event: RetryEvent) -> None:
    """Count ``event`` on ``telemetry``'s instruments."""
    if event.classification is not None:  # a handler failed
        telemetry.failures.add(
            1, {ATTR.QUEUE: event.queue, ATTR.CLASSIFICATION: str(event.classification)}
        )
    COUNTS[event.kind](telemetry, event)


def _scheduled(telemetry: Telemetry, event: RetryEvent) -> None:
    telemetry.scheduled.add(1, {ATTR.QUEUE: event.queue, ATTR.RULE: str(event.rule)})
    telemetry.planned_delay.record((event.delay_ms or 0) / 1000, {ATTR.QUEUE: event.queue})


def _hop(_: Telemetry, __: RetryEvent) -> None:
    """A hop is no news: the message is where it was, a tier further on."""


def _released(telemetry: Telemetry, event: RetryEvent) -> None:
    labels = {ATTR.QUEUE: event.queue}
    telemetry.released.add(1, labels)
    if event.lateness_ms is not None:
        telemetry.lateness.record(event.lateness_ms / 1000, labels)


def _dead_lettered(telemetry: Telemetry, event: RetryEvent) -> None:
    telemetry.dead_lettered.add(1, {ATTR.QUEUE: event.queue, ATTR.REASON: str(event.reason)})


def _outage_started(telemetry: Telemetry, event: RetryEvent) -> None:
    labels = {ATTR.QUEUE: event.queue}
    telemetry.outage_entered.add(1, labels)
    telemetry.outage_active.add(1, labels)


def _outage_ended(telemetry: Telemetry, event: RetryEvent) -> None:
    labels = {ATTR.QUEUE: event.queue}
    telemetry.outage_active.add(-1, labels)
    telemetry.outage_duration.record((event.duration_ms or 0) / 1000, labels)


COUNTS: Mapping[EventKind, Callable[[Telemetry, RetryEvent], None]] = {
    EventKind.SCHEDULED: _scheduled,
    EventKind.HOP: _hop,
    EventKind.RELEASED: _released,
    EventKind.DEAD_LETTERED: _dead_lettered,
    EventKind.OUTAGE_STARTED: _outage_started,
    EventKind.OUTAGE_ENDED: _outage_ended,
}
"""What each kind counts; a kind without a row here fails ``tests/unit/test_reporting.py``."""
