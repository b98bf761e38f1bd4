"""The frame rules of ``faststream_retry.core.fit``: the quick bound, lean copies, making room.

The encoder here is pamqp's, as aiormq uses it: what the broker receives is what is
measured.
"""

from __future__ import annotations

import datetime as dt
import decimal
import marshal
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands
from pamqp.header import ContentHeader

from faststream_retry.core import fit
from faststream_retry.core import headers as h
from tests.strategies import amqp_values

SHORT = ("x" * 255).encode().decode()


def exact(headers: dict[str, Any] | None, **properties: Any) -> int:
    """The payload of the content header frame that carries these properties."""
    return len(
        ContentHeader(0, 10, commands.Basic.Properties(headers=headers, **properties)).marshal()
    )


def every_property(headers: dict[str, Any] | None) -> int:
    """The largest content header with ``headers``: every short string at 255 bytes.

    But ``cluster_id``, which AMQP 0-9-1 deprecated and pamqp 4 refuses to encode.
    """
    return exact(
        headers,
        content_type=SHORT,
        content_encoding=SHORT,
        delivery_mode=2,
        priority=9,
        correlation_id=SHORT,
        reply_to=SHORT,
        expiration=SHORT,
        message_id=SHORT,
        timestamp=dt.datetime(2026, 1, 1),  # noqa: DTZ001 - AMQP timestamps are naive
        message_type=SHORT,
        user_id=SHORT,
        app_id=SHORT,
    )


def encodable(value: Any) -> bool:
    try:
        exact({"k": value})
    except Exception:  # whatever pamqp refuses is out of scope
        return False
    return True


def test_a_frame_payload_is_frame_max_less_the_frames_own_eight_bytes() -> None:
    """RabbitMQ names frame_max - 8 when it refuses a frame; 0 means no limit."""
    assert fit.payload_limit(131_072) == 131_064
    assert fit.payload_limit(4096) == 4088
    assert fit.payload_limit(0) is None


def test_the_properties_bound_is_the_largest_content_header_without_header_entries() -> None:
    """Ten short strings at 255 bytes, the octets, the timestamp, an empty table: exactly.

    ``cluster_id`` is counted though it cannot be set: pamqp 3 encoded it.
    """
    assert fit.PROPERTIES_BOUND == every_property({}) + 256 == 2588
    assert fit.frame_bound(None) == fit.frame_bound({}) == fit.PROPERTIES_BOUND


def test_the_bound_is_three_times_what_marshal_writes_on_top_of_the_properties() -> None:
    headers = {"retry-attempt": 3, "traceparent": "00-ab-cd-01"}
    assert fit.frame_bound(headers) == fit.PROPERTIES_BOUND + 3 * len(marshal.dumps(headers, 0))


@given(st.dictionaries(st.text(max_size=20), amqp_values, max_size=8))
def test_the_quick_bound_is_never_below_the_exact_size(headers: dict[str, Any]) -> None:
    """Whatever the headers (nested tables, lists, numbers, bytes, text in any script)."""
    headers = {k: v for k, v in headers.items() if encodable(v)}
    bound = fit.frame_bound(headers)
    if bound is not None:
        assert bound >= every_property(headers)


@pytest.mark.parametrize(
    "worst",
    [
        [{}] * 200,  # an empty table in an array: 5 bytes in AMQP, 2 in marshal
        [None] * 200,
        [True] * 200,
        [0.0] * 200,
        [0] * 200,
        [""] * 200,
        [[]] * 200,
        {str(n): {} for n in range(200)},
    ],
)
def test_the_bound_holds_for_the_values_marshal_writes_shortest(worst: Any) -> None:
    headers = {"": worst}
    bound = fit.frame_bound(headers)
    assert bound is not None
    assert bound >= every_property(headers)


@pytest.mark.parametrize(
    "value",
    [
        decimal.Decimal("1.5"),
        dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        type("Sub", (str,), {})("x"),
    ],
)
def test_no_quick_bound_for_what_marshal_does_not_take(value: Any) -> None:
    """A decimal, a timestamp, a subclass of a builtin: measured exactly instead."""
    assert fit.frame_bound({"k": value}) is None
    assert fit.frame_bound({"k": [value]}) is None


def test_a_lean_copy_keeps_what_decides_and_what_an_operator_reads_first() -> None:
    headers = {
        h.ATTEMPT: 3,
        h.DUE: 123,
        h.REASON: "exhausted",
        h.EXCEPTION: "ValueError",
        h.ERROR: "é" * 300,
        h.HISTORY: [{"attempt": 1}],
        h.TRACEBACK: "Traceback ...",
        h.REPLAYED: [{"at": 1}],
        "own": "kept",
    }
    lean = fit.lean(headers)
    assert set(lean) == {h.ATTEMPT, h.DUE, h.REASON, h.EXCEPTION, h.ERROR, "own"}
    assert lean[h.ERROR] == h.truncate("é" * 300, h.HISTORY_ERROR_LIMIT)
    assert len(lean[h.ERROR].encode()) <= h.HISTORY_ERROR_LIMIT
    assert headers[h.TRACEBACK] == "Traceback ..."  # the copy's headers, not these, change


def test_a_lean_copy_leaves_an_error_that_is_not_text_as_it_is() -> None:
    assert fit.lean({h.ERROR: b"x" * 500}) == {h.ERROR: b"x" * 500}
    assert fit.lean({"own": 1}) == {"own": 1}


def weigh(headers: Mapping[str, Any]) -> int:
    return exact(dict(headers), message_id="m")


def entry(key: str, value: Any) -> int:
    return weigh({key: value}) - weigh({})


def test_making_room_leaves_out_the_largest_own_headers_first_and_as_few_as_it_takes() -> None:
    headers = {
        h.REASON: "invalid",
        h.ERROR: "no room",
        "small": "s" * 10,
        "large": "l" * 3000,
        "medium": "m" * 2000,
    }
    limit = weigh(headers) - 2500  # leaving out "large" alone is enough
    made = fit.make_room(headers, weigh, limit)
    assert made is not None
    kept, dropped = made
    assert dropped == [("large", entry("large", "l" * 3000))]
    assert set(kept) == {h.REASON, h.ERROR, "small", "medium"}
    assert kept[h.ERROR] == (
        f"Left out to fit in a frame ({limit:,} bytes): 'large' "
        f"({entry('large', 'l' * 3000):,} bytes). no room"
    )
    assert weigh(kept) <= limit


def test_making_room_names_every_header_it_leaves_out_in_order() -> None:
    headers = {h.ERROR: "e", "b": "x" * 1000, "a": "x" * 1000, "c": "y" * 2000}
    limit = weigh({h.ERROR: "e" * 200})
    made = fit.make_room(headers, weigh, limit)
    assert made is not None
    kept, dropped = made
    assert [key for key, _ in dropped] == ["c", "a", "b"]  # the largest, then by name
    assert kept == {h.ERROR: kept[h.ERROR]}
    assert kept[h.ERROR].startswith(
        f"Left out to fit in a frame ({limit:,} bytes): 'c' ({entry('c', 'y' * 2000):,} bytes), "
        f"'a' ({entry('a', 'x' * 1000):,} bytes), 'b' ("
    )
    assert kept[h.ERROR].endswith(" bytes). e")


def test_making_room_keeps_the_retry_state_and_gives_up_when_that_alone_is_too_large() -> None:
    state = dict.fromkeys(h.RETRY_STATE, "v" * 100)
    assert fit.make_room({**state, "own": "o"}, weigh, weigh(state) - 1) is None
    made = fit.make_room({**state, "own": "o" * 500}, weigh, weigh(state) + 200)
    assert made is not None
    assert set(made[0]) == set(state)


def test_making_room_changes_nothing_that_fits_already() -> None:
    headers = {h.ERROR: "e", "own": "o"}
    assert fit.make_room(headers, weigh, weigh(headers)) == (headers, [])


def test_making_room_starts_an_error_that_is_not_text_afresh() -> None:
    made = fit.make_room({h.ERROR: 5, "own": "o" * 100}, weigh, weigh({h.ERROR: "x" * 80}))
    assert made is not None
    assert (
        made[0][h.ERROR]
        == f"Left out to fit in a frame ({weigh({h.ERROR: 'x' * 80}):,} bytes): 'own' ({entry('own', 'o' * 100):,} bytes)."
    )


def test_making_room_stops_as_soon_as_the_dead_letter_fits_exactly() -> None:
    """A frame filled to its last byte is a frame that fits."""

    def length(headers: Mapping[str, Any]) -> int:
        return sum(len(key) + len(str(value)) for key, value in headers.items())

    headers = {h.REASON: "invalid", "a": "x" * 100, "b": "y" * 50}
    after_a = {h.REASON: "invalid", "b": "y" * 50}
    error = "Left out to fit in a frame (0 bytes): 'a' (101 bytes)."
    limit = length({**after_a, h.ERROR: error.replace("(0 bytes)", "(000 bytes)")})
    made = fit.make_room(headers, length, limit)
    assert made is not None
    assert made[1] == [("a", 101)]
    assert length(made[0]) == limit


def test_making_room_says_where_the_limit_is() -> None:
    """A transport's own limit is named in the note (Redis: a header of its binary format)."""
    limit = weigh({h.ERROR: "x" * 80})
    made = fit.make_room({"own": "o" * 100}, weigh, limit, where="in a place")
    assert made is not None
    assert made[0][h.ERROR].startswith("Left out to fit in a place (")
