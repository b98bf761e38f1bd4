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
    PermanentError,
    RetryConfigError,
    RetryLater,
    RetryTopologyError,
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
    from faststream_retry.headers import exception_name  # noqa: PLC0415

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
    ]
    assert [f"{r}" for r in faststream_retry.Rule] == [
        "explicit",
        "handler",
        "default",
        "builtin",
        "fallback",
        "dead_lettering",
    ]
