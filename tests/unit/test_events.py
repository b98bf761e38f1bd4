"""The words on the wire and in logs, and hooks that fail (pure)."""

from __future__ import annotations

import logging

import pytest

from faststream_retry.events import EventKind, Reason, RetryEvent, emit


def test_words_format_as_their_value() -> None:
    """In f-strings, %-formatting and with a format spec, a word is its value."""
    assert f"{Reason.EXHAUSTED}" == "exhausted"
    assert f"[{EventKind.HOP:>5}]" == "[  hop]"
    assert "%s" % Reason.PERMANENT == "permanent"  # noqa: UP031 - the logging style
    assert str(EventKind.DEAD_LETTERED) == "dead_lettered"


def test_a_failing_hook_is_logged_and_the_next_one_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One broken hook costs a log line with its traceback, not the other hooks."""
    seen: list[RetryEvent] = []

    def broken(event: RetryEvent) -> None:
        raise RuntimeError(event.queue)

    event = RetryEvent(EventKind.SCHEDULED, "orders", "m1", attempt=1, at_ms=0)
    with caplog.at_level(logging.ERROR, logger="faststream_retry"):
        emit([broken, seen.append], event)
    assert seen == [event]
    [record] = caplog.records
    assert record.getMessage() == f"faststream-retry hook {broken!r} failed on scheduled"
    assert record.exc_info is None  # formatted by the plugin, bounded (see _log)
    assert record.exc_text is not None
    assert record.exc_text.startswith("Traceback (most recent call last):\n")
    assert record.exc_text.endswith("RuntimeError: orders")
