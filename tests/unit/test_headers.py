"""The wire format: round trips, hostile values and the size bound (pure)."""

from __future__ import annotations

import datetime as dt
import decimal
import struct
import time
from importlib.metadata import version
from typing import Any

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from pamqp.decode import field_table as decode_table
from pamqp.encode import field_table as encode_table

from faststream_retry.core import headers as h
from faststream_retry.rabbit.publisher import encodable_headers
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

    @pytest.mark.parametrize("count", sorted(h.BROKER_COUNTS))
    def test_a_quorum_queues_delivery_counts_never_travel_on_a_copy(self, count: str) -> None:
        """They count that queue's returns (4.3 adds x-acquired-count): on a copy they mislead."""
        assert h.carry_over({count: 3, "x-app": 1}) == {"x-app": 1}

    def test_the_broker_counts_are_the_ones_rabbitmq_sets(self) -> None:
        """3.x and 4.0 set x-delivery-count; 4.3 adds x-acquired-count (every return)."""
        assert sorted(h.BROKER_COUNTS) == ["x-acquired-count", "x-delivery-count"]
        assert h.without_broker_counts(
            {"x-delivery-count": 1, "x-acquired-count": 2, "x-app": 3}
        ) == {"x-app": 3}
        assert h.without_broker_counts(None) == {}

    def test_sender_selected_routing_never_travels_on_a_copy(self) -> None:
        """CC and BCC would route every copy (and its dead-lettering) to those queues too."""
        incoming = {"CC": ["victim"], "BCC": ["other"], "cc": "app's own", "x-app": 1}
        assert h.carry_over(incoming) == {"cc": "app's own", "x-app": 1}
        copy = h.retry_headers(incoming, failure(1), due_ms=1)
        dead = h.dead_letter_headers(incoming, failure(), reason="permanent", origin_queue="q")
        assert not {"CC", "BCC"} & (set(copy) | set(dead))

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
        expired = h.expired_from(decoded)
        assert expired is None or (isinstance(expired, str) and expired)
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


class TestExpiredFrom:
    """Which queue a delivery expired out of: how the middleware knows a tier released it."""

    def test_the_newest_death_record_names_the_queue(self) -> None:
        """RabbitMQ lists the most recent death first; an expiry names its queue."""
        deaths = [
            {"queue": "retry.delay.1000", "reason": "expired", "count": 1},
            {"queue": "orders", "reason": "rejected", "count": 1},
        ]
        assert h.expired_from({"x-death": deaths}) == "retry.delay.1000"
        assert h.expired_from({"x-death": tuple(deaths)}) == "retry.delay.1000"

    def test_bytes_are_read_as_text(self) -> None:
        """The wire may carry either spelling of a string."""
        death = {"queue": b"retry.delay.1000", "reason": b"expired"}
        assert h.expired_from({"x-death": [death]}) == "retry.delay.1000"

    @pytest.mark.parametrize(
        "headers",
        [
            None,
            {},
            {"x-death": []},
            {"x-death": "retry.delay.1000"},
            {"x-death": [{"queue": "orders", "reason": "rejected"}]},
            {
                "x-death": [
                    {"queue": "orders", "reason": "rejected"},
                    {"queue": "t", "reason": "expired"},
                ]
            },
            {"x-death": [{"queue": "", "reason": "expired"}]},
            {"x-death": [{"queue": 7, "reason": "expired"}]},
            {"x-death": [{"reason": "expired"}]},
            {"x-death": ["expired"]},
        ],
    )
    def test_anything_but_a_newest_expiry_with_a_queue_is_none(
        self, headers: dict[str, Any] | None
    ) -> None:
        """Missing, garbled, another reason, or an older expiry only: not released by a tier."""
        assert h.expired_from(headers) is None


class TestRepair:
    def test_only_values_the_encoder_refuses_are_left_out(self) -> None:
        """A refused value costs its own header only; the message goes on with the rest."""
        headers = {"ok": 1, "huge": 2**64, "plain": b"x", h.ATTEMPT: 3}
        assert encodable_headers(headers) == {"ok": 1, h.ATTEMPT: 3}


numeric_text = st.text(alphabet=st.sampled_from("0123456789 \t²³¹٣߂\ufffd"), max_size=25)


class TestNumbers:
    """The number reader's bounds, one value either side of each."""

    @given(st.one_of(numeric_text, numeric_text.map(str.encode)))
    def test_numbers_as_text_never_raise(self, raw: str | bytes) -> None:
        """Digits int() refuses ('²', which str.isdigit() takes) read as missing."""
        assert 0 <= h.read_attempt({h.ATTEMPT: raw}) < 2**31
        due = h.read_due({h.DUE: raw})
        assert due is None or 0 <= due < 2**63

    def test_non_ascii_digits_are_not_numbers(self) -> None:
        """Only ASCII digits count, in text or in bytes."""
        for raw in ("²", "٣", "1²", b"\xff7", bytearray(b"7\xff")):
            assert h.read_attempt({h.ATTEMPT: raw}) == 0, raw

    def test_text_and_bytes_spellings(self) -> None:
        """ASCII digits with surrounding blanks read as the number, as str, bytes or bytearray."""
        for raw in (" 7\t", b" 7 ", bytearray(b"7")):
            assert h.read_attempt({h.ATTEMPT: raw}) == 7, raw

    def test_attempt_upper_bound_is_exclusive(self) -> None:
        """2**31 - 1 is the largest readable attempt, as int, float or text."""
        for top in (2**31 - 1, float(2**31 - 1), str(2**31 - 1)):
            assert h.read_attempt({h.ATTEMPT: top}) == 2**31 - 1
        for over in (2**31, float(2**31), str(2**31)):
            assert h.read_attempt({h.ATTEMPT: over}) == 0

    def test_zero_is_a_number(self) -> None:
        """0 reads as 0, not as missing (a due time of 0 is due now, not unreadable)."""
        for zero in (0, 0.0, decimal.Decimal(0), "0", b"0"):
            assert h.read_due({h.DUE: zero}) == 0, zero
        for below in (-1, -0.5, decimal.Decimal("-0.1")):
            assert h.read_due({h.DUE: below}) is None, below

    def test_values_python_cannot_convert_read_as_missing(self) -> None:
        """A signalling-NaN decimal and a datetime before the epoch's calendar never raise."""
        assert h.read_attempt({h.ATTEMPT: decimal.Decimal("sNaN")}) == 0
        assert h.read_due({h.DUE: dt.datetime.min}) is None  # noqa: DTZ901 - AMQP times are naive
        assert h.read_due({h.DUE: dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc)}) is None

    def test_at_most_twenty_digits_are_parsed(self) -> None:
        """A 20-digit numeral is read; a 21-digit one is refused before int() sees it."""
        assert h.read_due({h.DUE: "0" * 19 + "5"}) == 5
        assert h.read_due({h.DUE: "0" * 20 + "5"}) is None

    def test_now_ms_is_the_wall_clock_in_integer_milliseconds(self) -> None:
        """Due times are epoch ms as int; a float or another unit would misplace every due."""
        before = time.time_ns() // 1_000_000
        now = h.now_ms()
        after = time.time_ns() // 1_000_000
        assert type(now) is int
        assert before <= now <= after


class TestTruncation:
    def test_a_text_at_the_limit_is_kept_whole(self) -> None:
        """Exactly ``limit`` bytes is not cut; one more is, to exactly ``limit`` bytes."""
        assert h.truncate("abcde", 5) == "abcde"
        assert h.truncate("abcdef", 5) == "ab..."
        assert h.truncate_tail("abcde", 5) == "abcde"
        assert h.truncate_tail("abcdef", 5) == "...ef"

    def test_cut_lands_on_whole_characters(self) -> None:
        """A multi-byte character split by the cut is dropped, never half-sent."""
        assert h.truncate("é" * 10, 8) == "éé..."
        assert h.truncate_tail("é" * 10, 8) == "...éé"

    def test_a_lone_surrogate_is_escaped_and_counted_escaped(self) -> None:
        """A lone surrogate (from a str(exception)) becomes its 6-character escape, never lost."""
        assert h.truncate("\ud800", 10) == "\\ud800"
        assert h.truncate("a\udc80b", 8) == "a\\udc80b"  # 8 bytes escaped: kept whole
        assert h.truncate("a\udc80bc", 8) == "a\\udc..."  # 9 bytes escaped: cut
        assert h.truncate("\ud800" * 10, 5) == "\\u..."
        assert h.truncate_tail("\ud800", 10) == "\\ud800"
        assert h.truncate_tail("ba\udc80", 8) == "ba\\udc80"
        assert h.truncate_tail("cba\udc80", 8) == "...udc80"
        assert h.truncate_tail("\ud800" * 10, 5) == "...00"

    def test_what_truncate_returns_always_encodes(self) -> None:
        """Every cut and every kept text is valid UTF-8, for the AMQP encoder."""
        for text in ("\ud800", "é\udfff" * 50, "x" * 3000):
            for limit in (5, 8, 200, 4096):
                h.truncate(text, limit).encode()
                h.truncate_tail(text, limit).encode()

    def test_a_str_subclass_is_cut_by_str_itself(self) -> None:
        """A str subclass that overrides encode() is still cut, by str's own methods."""

        class Sly(str):
            __slots__ = ()

            def encode(self, *_: object, **__: object) -> bytes:
                raise RuntimeError("no")

        assert h.truncate(Sly("abcdef"), 5) == "ab..."
        assert type(h.truncate(Sly("abc"), 5)) is str


class TestExactHeaders:
    """Every header the plugin writes, compared whole."""

    def test_first_failure(self) -> None:
        """A message's first failure starts the record."""
        record = h.FailureRecord(attempt=1, at_ms=1000, exception="app.E", error="boom")
        assert h.retry_headers(None, record, due_ms=1500) == {
            h.VERSION: 1,
            h.ATTEMPT: 1,
            h.DUE: 1500,
            h.FIRST_FAILED_AT: 1000,
            h.LAST_FAILED_AT: 1000,
            h.HISTORY: [
                {"attempt": 1, "at": 1000, "exception": "app.E", "error": "boom", "delay": 0}
            ],
        }

    def test_later_failures_keep_the_first_time_and_the_history(self) -> None:
        """retry-first-failed-at is written once; last-failed-at and history move on."""
        first = h.retry_headers(
            {"app": b"x"},
            h.FailureRecord(attempt=1, at_ms=1000, exception="E", error="a", delay_ms=500),
            due_ms=1500,
        )
        second = h.dead_letter_headers(
            first,
            h.FailureRecord(attempt=2, at_ms=2000, exception="F", error="b"),
            reason="exhausted",
            origin_queue="orders",
        )
        assert second == {
            "app": bytearray(b"x"),
            h.VERSION: 1,
            h.ATTEMPT: 2,
            h.FIRST_FAILED_AT: 1000,
            h.LAST_FAILED_AT: 2000,
            h.HISTORY: [
                {"attempt": 1, "at": 1000, "exception": "E", "error": "a", "delay": 500},
                {"attempt": 2, "at": 2000, "exception": "F", "error": "b", "delay": 0},
            ],
            h.REASON: "exhausted",
            h.EXCEPTION: "F",
            h.ERROR: "b",
            h.TRACEBACK: "",
            h.ORIGIN_QUEUE: "orders",
        }

    def test_unreadable_first_failure_time_is_replaced(self) -> None:
        """A garbled retry-first-failed-at is rewritten as this failure's time."""
        headers = h.retry_headers({h.FIRST_FAILED_AT: "soon"}, failure(), due_ms=1)
        assert headers[h.FIRST_FAILED_AT] == failure().at_ms

    def test_a_retry_copy_sheds_the_dead_letter_keys(self) -> None:
        """A message replayed from the DLQ that fails again is a retry, not a dead letter."""
        dead = h.dead_letter_headers(None, failure(), reason="permanent", origin_queue="q")
        again = h.retry_headers(dead, failure(2), due_ms=5)
        for key in (h.REASON, h.EXCEPTION, h.ERROR, h.TRACEBACK, h.ORIGIN_QUEUE):
            assert key not in again, key

    def test_history_entries_are_read_field_by_field(self) -> None:
        """Each field of a history entry is read on its own; a bad field reads as empty."""
        incoming = {
            h.HISTORY: [
                {
                    "attempt": 3,
                    "at": 7,
                    "exception": b"E\xff",
                    "error": bytearray(b"x"),
                    "delay": 9,
                },
                {"attempt": "x", "at": -1, "exception": 5, "error": None, "delay": True},
            ]
        }
        history = h.retry_headers(incoming, failure(4), due_ms=1)[h.HISTORY]
        assert history[:2] == [
            {"attempt": 3, "at": 7, "exception": "E\ufffd", "error": "x", "delay": 9},
            {"attempt": 0, "at": 0, "exception": "", "error": "", "delay": 0},
        ]

    def test_history_strings_are_bounded_on_read(self) -> None:
        """An incoming history with huge strings is cut to the history's bounds."""
        incoming = {h.HISTORY: [{"exception": "E" * 1000, "error": "e" * 1000}]}
        entry = h.retry_headers(incoming, failure(), due_ms=1)[h.HISTORY][0]
        assert len(entry["exception"]) == h.EXCEPTION_LIMIT
        assert len(entry["error"]) == h.HISTORY_ERROR_LIMIT

    def test_a_record_bounds_its_strings(self) -> None:
        """The exception name is cut on the record; the error where it is written."""
        record = h.FailureRecord(attempt=1, at_ms=1, exception="E" * 500, error="e" * 5000)
        assert len(record.exception) == h.EXCEPTION_LIMIT
        assert len(record.as_entry()["error"]) == h.HISTORY_ERROR_LIMIT
        dead = h.dead_letter_headers(None, record, reason="permanent", origin_queue="q" * 300)
        assert len(dead[h.ERROR]) == h.ERROR_LIMIT
        assert len(dead[h.ORIGIN_QUEUE]) == h.QUEUE_LIMIT

    def test_sanitize_turns_bytes_into_bytearray_at_any_depth(self) -> None:
        """pamqp decodes byte arrays as bytes but encodes only bytearray."""
        assert h.sanitize(b"a") == bytearray(b"a")
        assert type(h.sanitize(b"a")) is bytearray
        assert h.sanitize({1: [b"b", (b"c",)]}) == {"1": [bytearray(b"b"), [bytearray(b"c")]]}
        wire: dict[Any, Any] = {"k": b"v", 5: "not a str key"}
        assert h.carry_over(wire) == {"k": bytearray(b"v")}


class TestReadRequeues:
    """How often the broker says a delivery came back: 3.x and 4.0 count every return in
    ``x-delivery-count``; 4.3 counts requeues only in ``x-acquired-count``."""

    def test_no_headers_and_no_counts_are_zero(self) -> None:
        assert h.read_requeues(None) == 0
        assert h.read_requeues({}) == 0
        assert h.read_requeues({"other": 5}) == 0

    @pytest.mark.parametrize(
        ("headers", "count"),
        [
            ({"x-delivery-count": 4}, 4),
            ({"x-acquired-count": 6}, 6),
            ({"x-delivery-count": 4, "x-acquired-count": 6}, 6),
            ({"x-delivery-count": 7, "x-acquired-count": 6}, 7),
            ({"x-delivery-count": "3"}, 3),
        ],
    )
    def test_the_larger_count_is_read(self, headers: dict[str, Any], count: int) -> None:
        assert h.read_requeues(headers) == count

    @pytest.mark.parametrize("value", [-1, "many", 2**31, True, None, [1], 1.5e300])
    def test_an_unreadable_count_is_zero(self, value: object) -> None:
        assert h.read_requeues({"x-acquired-count": value, "x-delivery-count": value}) == 0

    def test_the_largest_readable_count_is_just_under_two_to_the_31(self) -> None:
        assert h.read_requeues({"x-acquired-count": 2**31 - 1}) == 2**31 - 1


def test_an_exceptions_own_lines_end_its_traceback_text() -> None:
    """``exception_only_text`` is the tail ``traceback_text`` ends with, every line of it.

    A SyntaxError's own part is several lines (the file, the code, the caret, the
    message): the log's traceback cache joins its frames' text to exactly these.
    """
    try:
        compile("total = (", "<order rules>", "exec")
    except SyntaxError as exc:
        only = h.exception_only_text(exc)
        text = h.traceback_text(exc)
    assert only.startswith('  File "<order rules>", line 1\n')
    assert only.endswith("SyntaxError: '(' was never closed\n")
    assert text.startswith("Traceback (most recent call last):\n")
    assert text.endswith(only)
