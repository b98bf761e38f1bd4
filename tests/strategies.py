"""Hypothesis strategies shared by the unit tests and the fault suite."""

from __future__ import annotations

import datetime as dt

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
