"""Hypothesis strategies shared by the unit tests and the fault suite."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from faststream_retry.core import headers as h

RETRY_KEYS = list(h.RETRY_STATE)

# Every AMQP field value pamqp can decode, nested a little.
amqp_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=50),
    # Numbers as text, with the digits int() refuses although str.isdigit() takes them.
    st.text(alphabet=st.sampled_from("0123456789 \t²³¹٣߂"), max_size=25),
    st.binary(max_size=50),
    st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=-1000, max_value=1000),
    st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2100, 1, 1)),  # noqa: DTZ001 - AMQP timestamps are naive
)
amqp_values = st.recursive(
    amqp_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
hostile_headers = st.dictionaries(
    st.one_of(
        st.sampled_from([*RETRY_KEYS, "x-death", "x-first-death-queue"]), st.text(max_size=20)
    ),
    amqp_values,
    max_size=8,
)


def draw(strategy: st.SearchStrategy[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """``n`` values of ``strategy`` (hypothesis generates; a test asserts on the lot)."""
    found: list[dict[str, Any]] = []

    @settings(
        max_examples=n,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(strategy)
    def collect(value: dict[str, Any]) -> None:
        found.append(value)

    collect()
    return found


# What JSON can carry (NATS and Redis headers hold text; the plugin's own are JSON text).
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=40),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
header_texts = st.one_of(
    st.text(max_size=60),
    json_values.map(json.dumps),
    st.sampled_from(
        ["NaN", "-Infinity", "1e309", "-1", "9" * 400, "[" * 2000, "null", '""', "[{}]"]
    ),
)
"""A header value as text: anything, JSON of anything, and numbers JSON cannot hold."""
text_header_names = st.one_of(
    st.sampled_from([*RETRY_KEYS, "retry-subject", "traceparent", "tracestate", "message_id"]),
    st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,15}", fullmatch=True),
)


def shown(headers: dict[str, Any]) -> dict[str, str]:
    """``headers`` for a failure's message: each value's repr cut to 80 characters."""
    return {str(k)[:40]: repr(v)[:80] for k, v in headers.items()}
