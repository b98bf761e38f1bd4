"""The words on the wire and in logs (pure)."""

from __future__ import annotations

from faststream_retry.core.events import EventKind, Reason


def test_words_format_as_their_value() -> None:
    """In f-strings, %-formatting and with a format spec, a word is its value."""
    assert f"{Reason.EXHAUSTED}" == "exhausted"
    assert f"[{EventKind.HOP:>5}]" == "[  hop]"
    assert "%s" % Reason.PERMANENT == "permanent"  # noqa: UP031 - the logging style
    assert str(EventKind.DEAD_LETTERED) == "dead_lettered"
