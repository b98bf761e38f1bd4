"""The wire format: round trips, hostile values and the size bound (pure)."""

from __future__ import annotations

import datetime as dt
import decimal
import struct
from importlib.metadata import version
from typing import Any

from hypothesis import given, reject, settings
from pamqp.decode import field_table as decode_table
from pamqp.encode import field_table as encode_table

from faststream_retry import headers as h
from faststream_retry.amqp.publisher import encodable_headers
from tests.strategies import hostile_headers

PAMQP_MAJOR = int(version("pamqp").split(".")[0])
RETRY_WRITES = {h.VERSION, h.ATTEMPT, h.DUE, h.FIRST_FAILED_AT, h.LAST_FAILED_AT, h.HISTORY}
DEAD_LETTER_WRITES = (RETRY_WRITES - {h.DUE}) | {
    h.REASON,
    h.EXCEPTION,
    h.ERROR,
    h.TRACEBACK,
    h.ORIGIN_QUEUE,
}


def failure(attempt: int = 1, error: str = "boom") -> h.FailureRecord:
    return h.FailureRecord(attempt=attempt, at_ms=1_700_000_000_000, exception="E", error=error)


class TestReaders:
    def test_attempt_and_due_round_trip(self) -> None:
        """What the plugin writes, it reads back."""
        headers = h.retry_headers({"app": "kept"}, failure(2), due_ms=1_700_000_005_000)
        assert h.read_attempt(headers) == 2
        assert h.read_due(headers) == 1_700_000_005_000
        assert headers["app"] == "kept"
        assert headers[h.VERSION] == h.FORMAT_VERSION

    def test_unreadable_values(self) -> None:
        """Garbled values read as 'missing': attempt 0, due now (None)."""
        for bad in ("soon", -1, True, 1.5e300, float("nan"), None, [1], {"a": 1}, "12x"):
            assert h.read_attempt({h.ATTEMPT: bad}) == 0
            assert h.read_due({h.DUE: bad}) is None

    def test_numeric_strings_and_datetimes_are_read(self) -> None:
        """Other producers' spellings of a number or a time are accepted."""
        assert h.read_attempt({h.ATTEMPT: "3"}) == 3
        assert h.read_attempt({h.ATTEMPT: decimal.Decimal(2)}) == 2
        when = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
        assert h.read_due({h.DUE: when}) == 1_767_225_600_000

    def test_far_future_due_stays_readable(self) -> None:
        """A huge due is impossible, not unreadable: the re-check dead-letters it."""
        assert h.read_due({h.DUE: 2**62}) == 2**62


class TestWriters:
    def test_broker_death_records_are_stripped(self) -> None:
        """x-death and x-first/last-death-* never travel on a republish."""
        kept = h.carry_over(
            {"x-death": [], "x-first-death-queue": "q", "x-last-death-reason": "r", "x-app": 1}
        )
        assert kept == {"x-app": 1}

    def test_history_is_bounded_and_ordered(self) -> None:
        """Only the last HISTORY_LIMIT failures are kept, oldest first."""
        headers: dict[str, Any] = {}
        for attempt in range(1, 25):
            headers = h.retry_headers(headers, failure(attempt), due_ms=1)
        attempts = [entry["attempt"] for entry in headers[h.HISTORY]]
        assert attempts == list(range(15, 25))

    def test_dead_letter_headers(self) -> None:
        """A dead letter carries reason, exception, error, traceback and origin queue."""
        headers = h.dead_letter_headers(
            {h.DUE: 5}, failure(3, "bad"), reason="exhausted", origin_queue="q", traceback="tb"
        )
        assert headers[h.REASON] == "exhausted"
        assert headers[h.ERROR] == "bad"
        assert headers[h.TRACEBACK] == "tb"
        assert headers[h.ORIGIN_QUEUE] == "q"
        assert h.DUE not in headers

    def test_added_bytes_are_bounded(self) -> None:
        """After 100 failures with huge messages, what the plugin adds stays under budget."""
        huge = "é" * 100_000
        headers: dict[str, Any] = {"app": "x"}
        base = len(encode_table(h.carry_over(headers)))
        for attempt in range(1, 101):
            headers = h.retry_headers(headers, failure(attempt, huge), due_ms=1)
        headers = h.dead_letter_headers(
            headers, failure(101, huge), reason="exhausted", origin_queue="q" * 1000, traceback=huge
        )
        added = len(encode_table(h.carry_over(headers))) - base
        assert added <= h.MAX_ADDED_BYTES, added


class TestHostile:
    @settings(max_examples=300, deadline=None)
    @given(hostile_headers)
    def test_anything_decodable_is_read_safely_and_re_encodes(self, raw: dict[str, Any]) -> None:
        """Whatever arrives on the wire: readers never raise, and the copy encodes."""
        try:
            wire = encode_table(h.sanitize(raw))
        except (TypeError, ValueError, OverflowError, struct.error):
            reject()  # pamqp cannot send this value, so it never arrives either
        _, decoded = decode_table(wire)
        attempt = h.read_attempt(decoded)
        assert 0 <= attempt < 2**31
        due = h.read_due(decoded)
        assert due is None or 0 <= due < 2**63
        for headers, written in (
            (h.retry_headers(decoded, failure(attempt + 1), due_ms=10), RETRY_WRITES),
            (
                h.dead_letter_headers(decoded, failure(), reason="invalid", origin_queue="q"),
                DEAD_LETTER_WRITES,
            ),
            (h.carry_over(decoded), set()),
        ):
            assert "x-death" not in headers
            # What the publisher sends always encodes. It leaves out only values that
            # came in and that this pamqp cannot encode again (pamqp 3 decodes some
            # decimals to values it cannot encode); pamqp 4 needs nothing left out.
            sent = encodable_headers(headers)
            encode_table(sent)
            dropped = set(headers) - set(sent)
            assert not dropped & written
            assert not dropped or PAMQP_MAJOR < 4


class TestRepair:
    def test_only_values_the_encoder_refuses_are_left_out(self) -> None:
        """A refused value costs its own header only; the message goes on with the rest."""
        headers = {"ok": 1, "huge": 2**64, "plain": b"x", h.ATTEMPT: 3}
        assert encodable_headers(headers) == {"ok": 1, h.ATTEMPT: 3}
