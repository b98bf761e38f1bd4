"""What a copy can carry on NATS (``nats.fitting``): sendable header names, max_payload."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from faststream_retry.core import headers as h
from faststream_retry.nats import fitting, wire

ID = "S:d:1:1:retry"


def size(headers: dict[str, object], body: int, msg_id: str | None = ID) -> int:
    return fitting.encoded_size(wire.encode(headers, msg_id=msg_id), body)


def test_a_header_name_nats_py_refuses_is_renamed_and_said() -> None:
    """``x/y`` and ``é`` are percent-encoded; ``retry-error`` names each, before the error."""
    sent = fitting.sendable({"x/y": "1", "é": "2", "ok": "3", h.ERROR: "boom"})
    assert sent["x%2Fy"] == "1"
    assert sent["%C3%A9"] == "2"
    assert sent["ok"] == "3"
    assert "x/y" not in sent
    assert sent[h.ERROR].startswith("Header names NATS clients cannot send, renamed: 'x/y' as")
    assert sent[h.ERROR].endswith(" boom")


def test_a_rename_that_is_taken_is_left_out_and_said() -> None:
    sent = fitting.sendable({"x/y": "1", "x%2Fy": "mine"})
    assert sent["x%2Fy"] == "mine"
    assert "'x/y' left out" in sent[h.ERROR]


def test_names_nats_py_sends_are_untouched() -> None:
    headers = {"a-b_c.d": "1", h.ERROR: "boom"}
    assert fitting.sendable(headers) == headers


def test_a_retry_that_fits_only_lean_goes_lean() -> None:
    """No history nor traceback; the attempt stays."""
    headers = {h.ATTEMPT: 1, h.HISTORY: [{"error": "e" * 200}] * 10, h.TRACEBACK: "t" * 4000}
    limit = size({h.ATTEMPT: 1}, 100) + 50
    fit = fitting.fitted(headers, 100, msg_id=ID, limit=limit, room=False)
    assert fit == ({h.ATTEMPT: 1}, ID)


def test_a_retry_that_does_not_fit_lean_is_not_sent() -> None:
    headers = {h.ATTEMPT: 1, "own": "o" * 1000}
    assert fitting.fitted(headers, 100, msg_id=ID, limit=500, room=False) is None


def test_a_dead_letter_leaves_out_its_own_largest_headers_and_says_so() -> None:
    headers = {h.REASON: "exhausted", h.ERROR: "boom", "own": "o" * 1000, "small": "s"}
    fit = fitting.fitted(headers, 100, msg_id=ID, limit=600, room=True)
    assert fit is not None
    kept, ident = fit
    assert ident == ID
    assert "own" not in kept
    assert kept["small"] == "s"
    assert "'own'" in kept[h.ERROR]
    assert size(kept, 100) <= 600


def test_a_body_that_leaves_no_room_keeps_what_fits_of_the_record() -> None:
    """Room for no header: none, and no Nats-Msg-Id (kept without its record, not lost)."""
    headers = {h.REASON: "exhausted", h.ORIGIN_QUEUE: "S.d", h.ERROR: "e" * 500}
    assert fitting.fitted(headers, 1000, msg_id=ID, limit=1000, room=True) == ({}, None)
    limit = size({h.REASON: "exhausted"}, 1000) + 5
    kept, ident = fitting.fitted(headers, 1000, msg_id=ID, limit=limit, room=True) or ({}, "")
    assert kept == {h.REASON: "exhausted"}
    assert ident == ID


@given(
    own=st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=200), max_size=8),
    error=st.text(max_size=2000),
    body=st.integers(0, 400_000),
)
def test_a_copy_said_to_fit_surely_fits(own: dict[str, str], error: str, body: int) -> None:
    """The bound without encoding is never below the exact size (what the server counts)."""
    limit = 512 * 1024
    history = [{"attempt": i, "error": error[:200], "exception": error[:200]} for i in range(10)]
    copy = {
        **fitting.sendable(own),
        h.ATTEMPT: 3,
        h.ERROR: h.truncate(error, h.ERROR_LIMIT),
        h.TRACEBACK: h.truncate(error * 3, h.TRACEBACK_LIMIT),
        h.HISTORY: history,
        h.ORIGIN_QUEUE: "S" * 200,
    }
    if fitting.fits_surely(own, body, limit):
        assert size(copy, body) <= limit
