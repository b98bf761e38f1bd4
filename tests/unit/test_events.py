"""The words on the wire and in logs (pure)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from faststream_retry.core.events import EventKind, Reason, RetryEvent, Rule, Verdict


def test_words_format_as_their_value() -> None:
    """In f-strings, %-formatting and with a format spec, a word is its value."""
    assert f"{Reason.EXHAUSTED}" == "exhausted"
    assert f"[{EventKind.HOP:>5}]" == "[  hop]"
    assert "%s" % Reason.PERMANENT == "permanent"  # noqa: UP031 - the logging style
    assert str(EventKind.DEAD_LETTERED) == "dead_lettered"


def test_an_event_is_built_by_keyword_only() -> None:
    """Eighteen fields, most optional: a positional call would put a value in the wrong one."""
    with pytest.raises(TypeError):
        RetryEvent(EventKind.HOP, "orders", "m1", 1, 0)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("built", "expected"),
    [
        (
            lambda: RetryEvent.scheduled(
                queue="q",
                message_id="m",
                attempt=2,
                at_ms=10,
                max_attempts=5,
                delay_ms=400,
                due_ms=410,
                rule=Rule.BUILTIN,
                classification=Verdict.TRANSIENT,
                exception="app.Down",
                error="down",
            ),
            RetryEvent(
                kind=EventKind.SCHEDULED,
                queue="q",
                message_id="m",
                attempt=2,
                at_ms=10,
                max_attempts=5,
                delay_ms=400,
                due_ms=410,
                rule=Rule.BUILTIN,
                classification=Verdict.TRANSIENT,
                exception="app.Down",
                error="down",
            ),
        ),
        (
            lambda: RetryEvent.scheduled(
                queue="q",
                message_id=None,
                attempt=1,
                at_ms=10,
                max_attempts=3,
                delay_ms=0,
                due_ms=None,
                rule=Rule.DEFAULT,
                classification=Verdict.TRANSIENT,
                immediate=True,
                exception="app.Down",
                error="down",
            ),
            RetryEvent(
                kind=EventKind.SCHEDULED,
                queue="q",
                message_id=None,
                attempt=1,
                at_ms=10,
                max_attempts=3,
                delay_ms=0,
                rule=Rule.DEFAULT,
                classification=Verdict.TRANSIENT,
                immediate=True,
                exception="app.Down",
                error="down",
            ),
        ),
        (
            lambda: RetryEvent.hop(
                queue="q", message_id="m", attempt=2, at_ms=10, tier_ms=800, due_ms=900
            ),
            RetryEvent(
                kind=EventKind.HOP,
                queue="q",
                message_id="m",
                attempt=2,
                at_ms=10,
                delay_ms=800,
                due_ms=900,
            ),
        ),
        (
            lambda: RetryEvent.released(
                queue="q", message_id="m", attempt=2, at_ms=910, due_ms=900, lateness_ms=10
            ),
            RetryEvent(
                kind=EventKind.RELEASED,
                queue="q",
                message_id="m",
                attempt=2,
                at_ms=910,
                due_ms=900,
                lateness_ms=10,
            ),
        ),
        (
            lambda: RetryEvent.dead_lettered(
                queue="q",
                message_id="m",
                attempt=5,
                at_ms=10,
                reason=Reason.EXHAUSTED,
                max_attempts=5,
                due_ms=7,
                rule=Rule.HANDLER,
                classification=Verdict.TRANSIENT,
                exception="app.Down",
                error="down",
            ),
            RetryEvent(
                kind=EventKind.DEAD_LETTERED,
                queue="q",
                message_id="m",
                attempt=5,
                at_ms=10,
                reason=Reason.EXHAUSTED,
                max_attempts=5,
                due_ms=7,
                rule=Rule.HANDLER,
                classification=Verdict.TRANSIENT,
                exception="app.Down",
                error="down",
            ),
        ),
        (
            lambda: RetryEvent.dead_lettered(
                queue="q",
                message_id=None,
                attempt=0,
                at_ms=10,
                reason=Reason.INVALID,
                exception="app.Down",
                error="down",
            ),
            RetryEvent(
                kind=EventKind.DEAD_LETTERED,
                queue="q",
                message_id=None,
                attempt=0,
                at_ms=10,
                reason=Reason.INVALID,
                exception="app.Down",
                error="down",
            ),
        ),
        (
            lambda: RetryEvent.outage_started(
                queue="q",
                message_id="m",
                attempt=1,
                at_ms=10,
                max_attempts=5,
                probe_ms=1000,
                failures=20,
                exception="app.Down",
                error="down",
            ),
            RetryEvent(
                kind=EventKind.OUTAGE_STARTED,
                queue="q",
                message_id="m",
                attempt=1,
                at_ms=10,
                max_attempts=5,
                delay_ms=1000,
                failures=20,
                exception="app.Down",
                error="down",
            ),
        ),
        (
            lambda: RetryEvent.outage_ended(
                queue="q",
                message_id="m",
                at_ms=10,
                probe_ms=1000,
                failures=3,
                probes=4,
                duration_ms=5000,
            ),
            RetryEvent(
                kind=EventKind.OUTAGE_ENDED,
                queue="q",
                message_id="m",
                attempt=0,
                at_ms=10,
                delay_ms=1000,
                failures=3,
                probes=4,
                duration_ms=5000,
            ),
        ),
    ],
    ids=[
        "scheduled",
        "immediate",
        "hop",
        "released",
        "dead_lettered",
        "dead_lettered-bare",
        "outage_started",
        "outage_ended",
    ],
)
def test_each_kind_has_a_constructor_that_sets_what_it_carries(
    built: Callable[[], RetryEvent], expected: RetryEvent
) -> None:
    """Each constructor fills its kind's fields, and leaves the rest at their defaults."""
    # Built here, not at collection: mutation testing swaps the code after collection.
    assert built() == expected
