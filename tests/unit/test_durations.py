"""Durations: one grammar read everywhere, one form printed everywhere, and they agree."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faststream_retry.core.durations import HELP, PATTERN, format_ms, ms_of_seconds, parse_duration
from faststream_retry.errors import RetryConfigError


def test_durations_take_seconds_or_a_unit() -> None:
    assert parse_duration(1, "k") == 1000
    assert parse_duration(0.25, "k") == 250
    assert parse_duration("250ms", "k") == 250
    assert parse_duration("1.5s", "k") == 1500
    assert parse_duration(" 2 m ", "k") == 120_000
    assert parse_duration("1h", "k") == 3_600_000
    assert parse_duration("1d", "k") == 86_400_000
    for bad in (-1, float("inf"), float("nan"), True, "1", "1y", "-1s", None, [1]):
        with pytest.raises(RetryConfigError, match=r"^k "):
            parse_duration(bad, "k")


def test_every_unit_either_grammar_took_and_the_printed_ones() -> None:
    """``w`` (the commands' ``--since 2w``), ``min`` (what ``format_ms`` prints), and sums."""
    assert parse_duration("2w", "k") == 14 * 86_400_000
    assert parse_duration("1 min", "k") == 60_000
    assert parse_duration("1 min 42.4 s", "k") == 102_400
    assert parse_duration("1h30m", "k") == 5_400_000
    assert parse_duration("1d 2h", "k") == 93_600_000
    assert parse_duration("\t3ms\n", "k") == 3
    for bad in ("1 min s", "1mins", "1m,5s", "m", "1.s", ".5s", "1e3s", "1 ٣s", "٣s", "1\u00a0s"):
        with pytest.raises(RetryConfigError):
            parse_duration(bad, "k")


def test_durations_round_up_to_the_ms_but_not_float_noise() -> None:
    assert parse_duration(0, "k") == 0
    assert parse_duration(0.0004, "k") == 1  # never shortened to 0
    assert parse_duration(0.1 * 3, "k") == 300  # 300.00000000000006 ms is 300 ms
    assert parse_duration(0.0010000001, "k") == 1  # below a nanosecond: float noise
    assert parse_duration(0.000001001, "k") == 1
    assert parse_duration("0.0004s", "k") == 1  # a string is the exact decimal it says
    assert parse_duration("1.0000001s", "k") == 1001
    assert ms_of_seconds(0.1 * 3) == 300


def test_an_error_names_the_option_and_says_what_it_takes() -> None:
    with pytest.raises(RetryConfigError) as bad:
        parse_duration("soon", "tick")
    assert str(bad.value) == f"tick takes {HELP}, got 'soon'"
    assert (bad.value.option, bad.value.problem) == ("tick", f"takes {HELP}, got 'soon'")
    with pytest.raises(RetryConfigError) as negative:
        parse_duration(-0.5, "tick")
    assert str(negative.value) == "tick must be a duration >= 0, got -0.5"
    assert negative.value.problem == "must be a duration >= 0, got -0.5"
    assert HELP == 'seconds (a number) or a string such as "250ms", "5s", "10m", "2h", "1d"'


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0 ms"),
        (999, "999 ms"),
        (1_000, "1 s"),
        (1_500, "1.5 s"),
        (59_999, "59.999 s"),
        (60_000, "1 min"),
        (60_001, "1 min 0.001 s"),
        (102_400, "1 min 42.4 s"),
        (605_000, "10 min 5 s"),
        (3_600_000, "1 h"),
        (5_400_000, "1 h 30 min"),
        (86_400_000, "1 d"),
        (93_600_000, "1 d 2 h"),
        (90_061_001, "1 d 1 h 1 min 1.001 s"),
    ],
)
def test_a_duration_is_printed_in_the_largest_units_without_rounding(ms: int, text: str) -> None:
    assert format_ms(ms) == text


@given(st.integers(min_value=0, max_value=10**12))
def test_what_is_printed_reads_back_as_itself(ms: int) -> None:
    """A log line's or a command's duration, pasted into a config, means the same."""
    assert parse_duration(format_ms(ms), "k") == ms


def test_the_pattern_is_the_grammar_json_schema_checks() -> None:
    """The schema's pattern is the parser's: ECMA and Python read it alike (ASCII only)."""
    for text in ("5s", " 1 min 42.4 s ", "1h30m", "2w"):
        assert re.fullmatch(PATTERN, text, re.ASCII)
    for text in ("5", "5 weeks", "-1s", ""):
        assert not re.fullmatch(PATTERN, text, re.ASCII)
