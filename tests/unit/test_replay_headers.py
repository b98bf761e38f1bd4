"""What a replay writes: a fresh retry state, the old one kept in ``retry-replayed``."""

from __future__ import annotations

from typing import Any

from hypothesis import given

from faststream_retry.core import headers as h
from tests.strategies import hostile_headers


def dead_letter(attempt: int = 4, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    record = h.FailureRecord(attempt=attempt, at_ms=2_000, exception="TimeoutError", error="slow")
    incoming = {h.FIRST_FAILED_AT: 1_000, h.HISTORY: [{"attempt": 1, "at": 1_000}], **(extra or {})}
    return h.dead_letter_headers(
        incoming, record, reason="exhausted", origin_queue="orders", traceback="Traceback..."
    )


class TestReaders:
    def test_read_ms_reads_a_timestamp_and_refuses_garbage(self) -> None:
        assert h.read_ms({h.FIRST_FAILED_AT: 1_000}, h.FIRST_FAILED_AT) == 1_000
        assert h.read_ms({h.FIRST_FAILED_AT: 0}, h.FIRST_FAILED_AT) == 0
        assert h.read_ms({h.FIRST_FAILED_AT: 2**53 - 1}, h.FIRST_FAILED_AT) == 2**53 - 1
        for bad in (2**53, -1, "x", None, True):
            assert h.read_ms({h.FIRST_FAILED_AT: bad}, h.FIRST_FAILED_AT) is None
        assert h.read_ms(None, h.FIRST_FAILED_AT) is None
        assert h.read_ms({}, h.FIRST_FAILED_AT) is None

    def test_read_text_cuts_and_takes_only_text(self) -> None:
        assert h.read_text({h.ERROR: "boom"}, h.ERROR) == "boom"
        assert h.read_text({h.ERROR: b"boom"}, h.ERROR) == "boom"
        assert h.read_text({h.ERROR: 5}, h.ERROR) == ""
        assert h.read_text(None, h.ERROR) == ""
        assert h.read_text({h.ERROR: "x" * 2000}, h.ERROR) == "x" * (h.ERROR_LIMIT - 3) + "..."
        assert h.read_text({h.ERROR: "abcdef"}, h.ERROR, limit=5) == "ab..."
        assert h.read_text({h.ERROR: "abcde"}, h.ERROR, limit=5) == "abcde"

    def test_read_history_checks_each_entry(self) -> None:
        assert h.read_history(None) == []
        assert h.read_history({h.HISTORY: "no"}) == []
        assert h.read_history({h.HISTORY: [{"attempt": 2, "at": 5, "exception": "E"}]}) == [
            {"attempt": 2, "at": 5, "exception": "E", "error": "", "delay": 0}
        ]


class TestReplayedHeaders:
    def test_the_retry_state_goes_and_the_story_stays(self) -> None:
        """A replayed message starts again at attempt 0, with what happened kept."""
        incoming = dead_letter(
            extra={"app": "kept", "x-death": [{}], "x-delivery-count": 3, "x-acquired-count": 5}
        )
        out = h.replayed_headers(incoming, at_ms=9_000)
        assert out["app"] == "kept"
        assert h.read_attempt(out) == 0
        for gone in (
            h.VERSION,
            h.ATTEMPT,
            h.DUE,
            h.FIRST_FAILED_AT,
            h.LAST_FAILED_AT,
            h.HISTORY,
            h.REASON,
            h.EXCEPTION,
            h.ERROR,
            h.TRACEBACK,
            h.ORIGIN_QUEUE,
            "x-death",
            "x-delivery-count",
            "x-acquired-count",
        ):
            assert gone not in out, gone
        assert out[h.REPLAYED] == [
            {
                "at": 9_000,
                "reason": "exhausted",
                "attempts": 4,
                "exception": "TimeoutError",
                "error": "slow",
                "first-failed-at": 1_000,
                "last-failed-at": 2_000,
                "origin-queue": "orders",
                "history": [
                    {"attempt": 1, "at": 1_000, "exception": "", "error": "", "delay": 0},
                    {
                        "attempt": 4,
                        "at": 2_000,
                        "exception": "TimeoutError",
                        "error": "slow",
                        "delay": 0,
                    },
                ],
            }
        ]

    def test_records_pile_up_newest_last_and_bounded(self) -> None:
        headers = dead_letter()
        for at in range(1, 6):
            headers = h.replayed_headers(
                {**dead_letter(attempt=at), h.REPLAYED: headers.get(h.REPLAYED, [])}, at_ms=at
            )
        records = headers[h.REPLAYED]
        assert len(records) == h.REPLAYED_LIMIT == 3
        assert [r["at"] for r in records] == [3, 4, 5]
        assert [r["attempts"] for r in records] == [3, 4, 5]

    def test_a_garbled_earlier_record_is_left_out_not_fatal(self) -> None:
        out = h.replayed_headers({h.REPLAYED: [{"at": 1}, "junk", 5]}, at_ms=2)
        assert [r["at"] for r in out[h.REPLAYED]] == [1, 2]
        assert [r["at"] for r in h.replayed_headers({h.REPLAYED: "junk"}, 3)[h.REPLAYED]] == [3]

    def test_missing_fields_read_as_empty(self) -> None:
        (record,) = h.replayed_headers(None, at_ms=7)[h.REPLAYED]
        assert record == {
            "at": 7,
            "reason": "",
            "attempts": 0,
            "exception": "",
            "error": "",
            "first-failed-at": 0,
            "last-failed-at": 0,
            "origin-queue": "",
            "history": [],
        }

    def test_long_fields_are_cut_to_the_history_bounds(self) -> None:
        long = {
            h.ERROR: "e" * 5000,
            h.EXCEPTION: "X" * 500,
            h.ORIGIN_QUEUE: "q" * 400,
            h.REASON: "r" * 300,
        }
        (record,) = h.replayed_headers(long, at_ms=1)[h.REPLAYED]
        assert len(record["error"].encode()) == h.HISTORY_ERROR_LIMIT
        assert len(record["exception"].encode()) == h.EXCEPTION_LIMIT
        assert len(record["origin-queue"].encode()) == h.QUEUE_LIMIT
        assert len(record["reason"].encode()) == h.EXCEPTION_LIMIT

    @given(hostile_headers)
    def test_never_raises_on_hostile_headers(self, incoming: dict[str, Any]) -> None:
        out = h.replayed_headers(incoming, at_ms=1)
        assert h.read_attempt(out) == 0
        assert out[h.REPLAYED][-1]["at"] == 1
