"""Reading dead letters for operators (pure): bodies, filters, times, the export format."""

from __future__ import annotations

import datetime as dt
import decimal
import gzip
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands
from pamqp.decode import field_table as decode_table
from pamqp.encode import field_table as encode_table

from faststream_retry.core import headers as h
from faststream_retry.ops.common import OperationError
from faststream_retry.ops.records import (
    DeadLetter,
    Selection,
    decode_body,
    iso_time,
    moment,
    parse_time,
    selection,
)
from faststream_retry.ops.wire import (
    Record,
    decode_value,
    encode_value,
    fingerprint,
    read_line,
    write_line,
)
from tests.strategies import amqp_values


class TestBodies:
    def test_json_text_and_binary(self) -> None:
        assert decode_body(b'{"a": [1]}', "application/json").kind == "json"
        assert decode_body(b'{"a": 1}', "application/vnd.x+json; charset=utf-8").kind == "json"
        assert decode_body(b'{"a": 1}', None).kind == "json"  # no type: try JSON first
        text = decode_body("grüße\nline".encode(), "text/plain")
        assert (text.kind, text.text) == ("text", "grüße\nline")
        binary = decode_body(b"\x00\x01\xff", "application/x-protobuf")
        assert (binary.kind, binary.text, binary.value) == ("hex", "00 01 ff", "0001ff")

    def test_gzip_is_undone_and_a_lying_encoding_shows_the_bytes(self) -> None:
        assert decode_body(gzip.compress(b'{"z": 1}'), "application/json", "gzip").value == {"z": 1}
        assert decode_body(b"\x00plain", None, "gzip").kind == "hex"

    def test_a_decoder_wins_and_a_failing_one_falls_back_and_says_so(self) -> None:
        def decoder(body: bytes, content_type: str | None, headers: Any) -> object:
            return {"n": len(body), "type": content_type, "h": headers.get("k")}

        done = decode_body(b"\x00\x01", "application/x-protobuf", None, {"k": "v"}, decoder)
        assert (done.kind, done.value) == (
            "decoder",
            {"n": 2, "type": "application/x-protobuf", "h": "v"},
        )

        def broken(body: bytes, content_type: str | None, headers: Any) -> object:
            raise ValueError("bad wire type")

        fallback = decode_body(b"\x00", None, None, None, broken)
        assert fallback.kind == "hex"
        assert fallback.text.startswith("(decoder failed: ValueError: bad wire type) ")

    def test_preview_is_one_short_line(self) -> None:
        body = decode_body(json.dumps({"k": "v" * 100}).encode(), "application/json")
        preview = body.preview(20)
        assert len(preview) == 20
        assert "\n" not in preview
        assert preview.endswith("…")


def letter(**hdrs: Any) -> DeadLetter:
    return DeadLetter.read(1, b"{}", {"message_id": "m1", "content_type": "application/json"}, hdrs)


class TestSelection:
    def test_empty_takes_everything(self) -> None:
        assert Selection().everything
        assert Selection().matches(letter())
        assert not selection(reasons=["permanent"]).everything

    def test_every_filter_must_hold(self) -> None:
        dead = letter(
            **{h.REASON: "permanent", h.EXCEPTION: "app.errors.BadOrder", h.LAST_FAILED_AT: 5_000}
        )
        assert Selection(reasons=frozenset({"permanent"})).matches(dead)
        assert not Selection(reasons=frozenset({"exhausted"})).matches(dead)
        assert Selection(exceptions=frozenset({"BadOrder"})).matches(dead)
        assert Selection(exceptions=frozenset({"app.errors.BadOrder"})).matches(dead)
        assert not Selection(exceptions=frozenset({"errors.BadOrder"})).matches(dead)
        assert Selection(ids=frozenset({"m1"})).matches(dead)
        assert not Selection(ids=frozenset({"m2"})).matches(dead)
        assert Selection(since_ms=5_000, until_ms=5_000).matches(dead)
        assert not Selection(since_ms=5_001).matches(dead)
        assert not Selection(until_ms=4_999).matches(dead)
        assert not Selection(reasons=frozenset({"permanent"}), ids=frozenset({"m2"})).matches(dead)

    def test_time_filters_fall_back_to_the_first_failure_and_skip_undated(self) -> None:
        assert Selection(since_ms=10).matches(letter(**{h.FIRST_FAILED_AT: 10}))
        assert not Selection(since_ms=10).matches(letter())
        assert not Selection(until_ms=10).matches(letter())

    def test_a_message_without_an_id_is_named_by_its_position(self) -> None:
        dead = DeadLetter.read(7, b"", {}, None)
        assert dead.key == "#7"
        assert Selection(ids=frozenset({"#7"})).matches(dead)

    def test_a_position_picks_a_message_whatever_its_id(self) -> None:
        """#N is the Nth row of dlq list, also when ids repeat."""
        dead = DeadLetter.read(3, b"", {"message_id": "dup"}, None)
        assert Selection(ids=frozenset({"#3"})).matches(dead)
        assert Selection(ids=frozenset({"dup"})).matches(dead)
        assert not Selection(ids=frozenset({"#4"})).matches(dead)


class TestTimes:
    now = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc)

    def test_ages_and_iso(self) -> None:
        noon = int(self.now.timestamp() * 1000)
        assert parse_time("2h", self.now) == noon - 7_200_000
        assert parse_time("30m", self.now) == noon - 1_800_000
        assert parse_time("1.5s", self.now) == noon - 1_500
        assert parse_time("7d", self.now) == noon - 7 * 86_400_000
        assert parse_time("2026-11-23T12:00:00", self.now) == noon  # UTC when no zone
        assert parse_time("2026-11-23T13:00:00+01:00", self.now) == noon

    def test_anything_else_names_both_forms(self) -> None:
        with pytest.raises(OperationError, match=r"ISO 8601 .* or an age"):
            parse_time("yesterday")


class TestWire:
    def test_a_message_survives_export_and_import(self) -> None:
        properties = commands.Basic.Properties(
            content_type="application/octet-stream",
            content_encoding="identity",
            headers={
                "b": bytearray(b"\x00\xff"),
                "d": decimal.Decimal("1.50"),
                "$t": {"$bytes": "x"},
            },
            delivery_mode=2,
            priority=4,
            correlation_id="c",
            reply_to="r",
            expiration="60000",
            message_id="m",
            timestamp=dt.datetime(2026, 1, 1, 0, 0),  # noqa: DTZ001 - AMQP timestamps are naive
            message_type="t",
            user_id="guest",
            app_id="a",
            cluster_id="",
        )
        back = read_line(write_line(Record("q.dlq", properties, bytes(range(256)))), "f:1")
        assert back.queue == "q.dlq"
        assert back.body == bytes(range(256))
        for name in (
            "content_type",
            "delivery_mode",
            "priority",
            "expiration",
            "timestamp",
            "user_id",
            "cluster_id",
        ):
            assert getattr(back.properties, name) == getattr(properties, name), name
        assert back.properties.headers == properties.headers

    @given(st.dictionaries(st.text(max_size=10), amqp_values, max_size=6))
    def test_any_header_table_round_trips_as_the_broker_would_deliver_it(
        self, table: dict[str, Any]
    ) -> None:
        try:
            delivered = decode_table(encode_table(table))[1]
        except Exception:  # the encoder refuses some values: those never reach a queue
            return
        back = decode_value(json.loads(json.dumps(encode_value(delivered))))
        assert repr(back) == repr(delivered)  # repr: a NaN never equals itself

    def test_a_line_that_is_not_a_record_is_named(self) -> None:
        for line in (
            "",
            "[]",
            '{"format": 2}',
            '{"format": 1, "queue": "q", "properties": {"x": 1}, "body": ""}',
        ):
            with pytest.raises(OperationError, match=r"dump\.jsonl:3: not an exported message"):
                read_line(line, "dump.jsonl:3")
        with pytest.raises(OperationError):
            read_line('{"format": 1, "queue": "q", "properties": {}, "body": "!!"}', "f:1")


class TestFingerprints:
    """``dlq purge --from-export`` removes a dead letter only if the export holds its fingerprint."""

    @staticmethod
    def message(**changes: Any) -> tuple[commands.Basic.Properties, bytes]:
        fields: dict[str, Any] = {
            "content_type": "application/json",
            "message_id": "m-1",
            "correlation_id": "c-1",
            "delivery_mode": 2,
            "timestamp": dt.datetime(2026, 11, 24, 12, 0, 0),  # noqa: DTZ001 - AMQP's are naive
            "headers": {"retry-reason": "exhausted", "bytes": b"\x00\xff", "n": 1.5},
        }
        body = changes.pop("body", b'{"order": 1}')
        fields.update(changes)
        return commands.Basic.Properties(**fields), body

    @given(st.dictionaries(st.text(max_size=10), amqp_values, max_size=6), st.binary())
    def test_a_message_and_its_export_line_have_one_fingerprint(
        self, table: dict[str, Any], body: bytes
    ) -> None:
        """Read from the queue, or read back from the line export wrote: the same digest."""
        try:
            delivered = decode_table(encode_table(table))[1]
        except Exception:  # the encoder refuses some values: those never reach a queue
            return
        properties, _ = self.message(headers=delivered)
        back = read_line(write_line(Record("q.dlq", properties, body)), "f:1")
        assert fingerprint(back.properties, back.body) == fingerprint(properties, body)

    @pytest.mark.parametrize(
        "change",
        [
            {"body": b'{"order": 2}'},
            {"message_id": "m-2"},
            {"correlation_id": None},
            {"priority": 1},
            {"timestamp": dt.datetime(2026, 11, 24, 12, 0, 1)},  # noqa: DTZ001
            {"headers": {"retry-reason": "permanent", "bytes": b"\x00\xff", "n": 1.5}},
            {"headers": {"retry-reason": "exhausted", "bytes": b"\x00\xfe", "n": 1.5}},
            {"headers": {"retry-reason": "exhausted", "bytes": "\x00\xff", "n": 1.5}},
            {"headers": {"retry-reason": "exhausted", "bytes": b"\x00\xff"}},
        ],
    )
    def test_any_other_byte_is_another_message(self, change: dict[str, Any]) -> None:
        assert fingerprint(*self.message(**change)) != fingerprint(*self.message())

    def test_what_the_broker_or_a_pass_changes_is_not_the_message(self) -> None:
        """Delivery counts are RabbitMQ's; a quorum pass drops another user's user_id."""
        headers = {"retry-reason": "exhausted", "bytes": b"\x00\xff", "n": 1.5}
        counted = {**headers, "x-delivery-count": 3, "x-acquired-count": 4}
        assert fingerprint(*self.message(headers=counted, user_id="ops")) == fingerprint(
            *self.message()
        )


HOSTILE_TIMES: list[object] = [
    2**53 - 1,  # read_ms's own bound: year 285,428
    253_402_300_800_000,  # 10000-01-01
    10**30,
    -5,
    "abc",
    "[/bold]",
    b"\xff",
    [1, 2],
    {"a": 1},
    decimal.Decimal("NaN"),
    float("nan"),
    float("inf"),
    True,
]


@pytest.mark.parametrize("value", HOSTILE_TIMES, ids=repr)
def test_a_time_that_names_no_moment_is_shown_as_text_everywhere(value: object) -> None:
    """A producer's retry-* time past year 9999, or of another type: text, never a raise."""
    from faststream_retry.cli.dlq import _when  # noqa: PLC0415
    from faststream_retry.web.app import _ms_text  # noqa: PLC0415

    for shown in (iso_time(value), _ms_text(value), _when(value), _when(value, short=True)):
        assert isinstance(shown, str)
        assert shown.startswith("not a time: ")
        assert len(shown) < 60
    assert _when(value, clock=True).startswith("not a time: ")
    assert moment(value) is None


def test_the_last_moment_a_calendar_holds_is_still_a_time() -> None:
    assert iso_time(253_402_300_799_999) == "9999-12-31T23:59:59.999+00:00"
    assert iso_time(1) == "1970-01-01T00:00:00.001+00:00"
    assert iso_time(0) is None
    assert iso_time(None) is None


def test_a_dead_letter_with_hostile_times_reads_and_answers() -> None:
    """Every retry-* time at year 285,428: list and show answers are whole."""
    far = 2**53 - 1
    letter = DeadLetter.read(
        1,
        b"{}",
        {"message_id": "m1"},
        {
            "retry-first-failed-at": far,
            "retry-last-failed-at": far,
            "retry-history": [{"attempt": 1, "at": far, "exception": "E", "delay": far}],
            "retry-replayed": [{"at": far}, {"at": b"\x00"}, "not a record"],
        },
    )
    assert letter.summary()["last_failed_at"] == f"not a time: {far}"
    details = letter.details()
    assert details["history"][0]["at"] == f"not a time: {far}"
    assert details["replayed"][1] == {"at": {"$bytes": "AA=="}}
    json.dumps(details, allow_nan=False)
