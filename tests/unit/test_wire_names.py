"""Names that leave the process: header values, metric labels and event values stay as they are.

A class moved to another module would change the ``retry-exception`` header of every dead
letter it causes, and an enum renamed would change metric labels that dashboards and alerts
select on. These tests pin them.
"""

from __future__ import annotations

import pytest

import faststream_retry
from faststream_retry import (
    EventKind,
    FastStreamRetryError,
    PermanentError,
    RetryConfigError,
    RetryLater,
    RetryTopologyError,
    RetryWorkerError,
    TransientError,
    Verdict,
)


@pytest.mark.parametrize(
    ("cls", "module"),
    [
        (TransientError, "faststream_retry.errors"),
        (PermanentError, "faststream_retry.errors"),
        (RetryLater, "faststream_retry.errors"),
        (RetryConfigError, "faststream_retry.errors"),
        (RetryTopologyError, "faststream_retry.errors"),
        (FastStreamRetryError, "faststream_retry.errors"),
        (RetryWorkerError, "faststream_retry.errors"),
    ],
)
def test_public_exceptions_keep_their_module(cls: type[BaseException], module: str) -> None:
    """``retry-exception`` is ``<module>.<qualname>``: the module is part of the wire format."""
    assert (cls.__module__, cls.__qualname__) == (module, cls.__name__)
    assert getattr(faststream_retry, cls.__name__) is cls


def test_metric_and_event_values() -> None:
    """Label values of the metrics and the values hooks receive."""
    assert [v.value for v in Verdict] == ["transient", "permanent"]
    assert [k.value for k in EventKind] == [
        "scheduled",
        "hop",
        "released",
        "dead_lettered",
        "outage_started",
        "outage_ended",
    ]


def test_exception_header_values() -> None:
    """What ``retry-exception`` says of each exception the plugin itself names."""
    from faststream_retry import InvalidDueTime  # noqa: PLC0415 - part of what is pinned
    from faststream_retry.core.headers import exception_name  # noqa: PLC0415

    assert exception_name(PermanentError()) == "faststream_retry.errors.PermanentError"
    assert exception_name(RetryLater(1)) == "faststream_retry.errors.RetryLater"
    assert exception_name(InvalidDueTime()) == "faststream_retry.InvalidDueTime"
    assert exception_name(TimeoutError()) == "TimeoutError"


def test_reason_and_rule_values() -> None:
    """``retry-reason`` values and the ``faststream_retry.rule`` label, as words."""
    assert [str(r) for r in faststream_retry.Reason] == [
        "permanent",
        "exhausted",
        "invalid",
        "poison",
        "expired",
        "maxlen",
        "stuck",
    ]
    assert [f"{r}" for r in faststream_retry.Rule] == [
        "explicit",
        "handler",
        "default",
        "builtin",
        "fallback",
        "dead_lettering",
    ]


def test_metric_and_span_attribute_names() -> None:
    """Dashboards and alerts select on these names: they are written out here, not imported."""
    from faststream_retry.reporting.telemetry import ATTR, METRICS  # noqa: PLC0415

    metrics = {k: v for k, v in vars(METRICS).items() if k.isupper()}
    assert metrics == {
        "SCHEDULED": "faststream_retry.retries.scheduled",
        "RELEASED": "faststream_retry.retries.released",
        "DEAD_LETTERED": "faststream_retry.dead_lettered",
        "FAILURES": "faststream_retry.failures",
        "LATENESS": "faststream_retry.lateness",
        "PLANNED_DELAY": "faststream_retry.planned_delay",
        "OUTAGE_ACTIVE": "faststream_retry.outage.active",
        "OUTAGE_ENTERED": "faststream_retry.outage.entered",
        "OUTAGE_PROBES": "faststream_retry.outage.probes",
        "OUTAGE_REQUEUED": "faststream_retry.outage.requeued",
        "OUTAGE_DURATION": "faststream_retry.outage.duration",
        "DLQ_MESSAGES": "faststream_retry.dlq.messages",
    }
    attributes = {k: v for k, v in vars(ATTR).items() if k.isupper()}
    assert attributes == {
        "SYSTEM": "messaging.system",
        "DESTINATION": "messaging.destination.name",
        "OPERATION": "messaging.operation.type",
        "MESSAGE_ID": "messaging.message.id",
        "ROUTING_KEY": "messaging.rabbitmq.destination.routing_key",
        "QUEUE": "faststream_retry.queue",
        "ATTEMPT": "faststream_retry.attempt",
        "MAX_ATTEMPTS": "faststream_retry.max_attempts",
        "CLASSIFICATION": "faststream_retry.classification",
        "RULE": "faststream_retry.rule",
        "DELAY_MS": "faststream_retry.delay_ms",
        "DUE_MS": "faststream_retry.due_ms",
        "NOW_MS": "faststream_retry.now_ms",
        "REMAINING_MS": "faststream_retry.remaining_ms",
        "TIER_MS": "faststream_retry.tier_ms",
        "LATENESS_MS": "faststream_retry.lateness_ms",
        "REASON": "faststream_retry.reason",
        "DLQ": "faststream_retry.dlq",
        "IMMEDIATE": "faststream_retry.immediate",
        "OUTAGE_AFTER": "faststream_retry.outage.after",
        "OUTAGE_PROBE_MS": "faststream_retry.outage.probe_ms",
        "OUTAGE_FAILURES": "faststream_retry.outage.failures",
        "OUTAGE_PROBE_COUNT": "faststream_retry.outage.probe_count",
        "OUTAGE_DURATION_MS": "faststream_retry.outage.duration_ms",
        "OUTAGE_END": "faststream_retry.outage.end",
        "EXCEPTION_TYPE": "exception.type",
        "EXCEPTION_MESSAGE": "exception.message",
    }
