"""The NATS transport's pure parts: names and subjects, the headers on the wire, the start
checks."""

from __future__ import annotations

import json
from types import SimpleNamespace

from hypothesis import example, given
from hypothesis import strategies as st

from faststream_retry.core import headers as h
from faststream_retry.nats import checks, naming, wire


def test_a_failure_record_survives_the_wire() -> None:
    """Every ``retry-*`` value comes back as the core wrote it: ints, text with line
    breaks, the history list; the application's headers travel as they came."""
    failure = h.FailureRecord(
        attempt=2, at_ms=1_700_000_000_000, exception="app.Boom", error="line one\r\nline two"
    )
    written = h.dead_letter_headers(
        {"app": "kept"},
        failure,
        reason="exhausted",
        origin_queue="ORDERS.billing",
        traceback='Traceback (most recent call last):\n  File "x"\nBoom: "quoted"',
    )
    encoded = wire.encode(written, msg_id="ORDERS:7:dead")
    assert all("\n" not in v and "\r" not in v for v in encoded.values())
    assert encoded["Nats-Msg-Id"] == "ORDERS:7:dead"
    decoded = wire.decode(encoded)
    decoded.pop("Nats-Msg-Id")
    assert decoded == written
    assert h.read_attempt(decoded) == 2
    assert h.read_history(decoded)[-1]["error"] == "line one\r\nline two"


def test_a_copy_carries_no_server_instruction_of_the_original() -> None:
    """``Nats-*`` headers of the message (any case) are never on a copy: only the plugin
    says what the server does with its publishes."""
    incoming = {
        "Nats-Msg-Id": "theirs",
        "Nats-Expected-Stream": "OTHER",
        "nats-rollup": "all",
        "Nats-TTL": "1s",
        "app": "kept",
    }
    encoded = wire.encode(h.carry_over(wire.decode(incoming)), msg_id="mine")
    assert encoded == {"app": "kept", "Nats-Msg-Id": "mine"}


def test_a_garbled_retry_header_is_kept_as_text_and_read_as_missing() -> None:
    """Not JSON: kept as its text; the core's readers take it as missing, never raise."""
    decoded = wire.decode({"retry-attempt": "two", "retry-due": "{", "retry-history": "[1,"})
    assert decoded == {"retry-attempt": "two", "retry-due": "{", "retry-history": "[1,"}
    assert h.read_attempt(decoded) == 0
    assert h.read_due(decoded) is None
    assert h.read_history(decoded) == []


def test_a_retry_header_nested_past_the_recursion_limit_is_kept_as_text() -> None:
    """3,000 ``[`` (3 KB) raise RecursionError, not ValueError, in json.loads: still text.

    Found in review: it escaped the sink, and FastStream terminated the message with no
    copy and no dead letter.
    """
    deep = "[" * 3000
    decoded = wire.decode({"retry-history": deep, "retry-origin-subject": deep})
    assert decoded == {"retry-history": deep, "retry-origin-subject": deep}
    assert h.read_history(decoded) == []


@given(st.dictionaries(st.text(min_size=1), st.text()))
def test_any_headers_encode_to_one_line_values(headers: dict[str, str]) -> None:
    """Whatever came in, every value of a copy is one line NATS can carry."""
    encoded = wire.encode(h.carry_over(wire.decode(headers)), msg_id="id")
    assert all("\n" not in v and "\r" not in v for v in encoded.values())


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=8,
)


@given(_JSON_VALUES)
@example("a\\b")
@example('say "hi"')
@example("tab\t")
@example("del\x7f")
@example("é")
@example(True)
def test_a_retry_value_is_written_as_json_writes_it(value: object) -> None:
    """The fast paths for ints and plain texts write exactly json's text (rolling deploys
    and every reader of the headers see the same bytes)."""
    assert wire.value(value) == json.dumps(
        value, ensure_ascii=True, separators=(",", ":"), default=str
    )


def _json_or_text(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


@given(
    st.text()
    | st.integers().map(str)
    | st.text().map(lambda t: f'"{t}"')
    | st.from_regex(r'\A"?[0-9a-z\x00-\x1f\x7f\\"\u00e9\udc80]*"?\Z')
)
@example("007")
@example("0")
@example("²")
@example('"\\u0041"')
@example('"a"b"')
@example('"\x01"')
@example('"\udc80"')
@example("-1")
@example("1.5")
@example('""')
@example('"')
def test_a_retry_value_is_read_as_json_reads_it(text: str) -> None:
    """The fast paths for digits and quoted texts read what json reads, of the same type
    (``"007"`` and ``"\\u0041"`` included); not JSON: the text itself."""
    read = wire.decode({"retry-x": text})["retry-x"]
    expected = _json_or_text(text)
    assert (type(read), repr(read)) == (type(expected), repr(expected))


def test_digits_past_python_s_int_limit_are_kept_as_text() -> None:
    """5,000 digits: ``int()`` refuses them (ValueError), as json does; kept as text."""
    digits = "1" * 5000
    assert wire.decode({"retry-attempt": digits}) == {"retry-attempt": digits}


def test_a_delay_subject_names_its_tier_and_subscriber() -> None:
    """The re-check reads the tier and the key back from the subject, and nothing else."""
    subject = naming.delay_subject("retry", 1600, "ORDERS.billing")
    assert subject == "retry.delay.1600.ORDERS.billing"
    assert naming.split_delay_subject("retry", subject) == (1600, "ORDERS.billing")
    for other in (
        "retry.delay.1600.ORDERS",  # no consumer token
        "retry.delay.1600.ORDERS.billing.extra",
        "retry.delay.0.ORDERS.billing",
        "retry.delay.x.ORDERS.billing",
        "other.delay.1600.ORDERS.billing",
        "retryx.delay.1600.ORDERS.billing",
        "retry.delay.1600.ORDERS.*",
    ):
        assert naming.split_delay_subject("retry", other) is None, other


def test_a_subscriber_key_is_its_stream_and_durable_or_a_stable_hash() -> None:
    """Durable: ``<stream>.<durable>``; ephemeral: the same key for the same subject."""
    assert naming.key_of("ORDERS", "billing", "orders.*") == "ORDERS.billing"
    one = naming.key_of("ORDERS", None, "orders.*")
    assert one == naming.key_of("ORDERS", None, "orders.*")
    assert one != naming.key_of("ORDERS", None, "orders.eu")
    assert naming.key_stream(one) == "ORDERS"
    assert naming.split_delay_subject("p", naming.delay_subject("p", 100, one)) == (100, one)


def test_the_plugin_names_are_valid_stream_and_consumer_names() -> None:
    """A prefix with dots or wildcards still makes names JetStream takes."""
    for name in (
        naming.delay_stream("my.app*"),
        naming.dlq_stream("my.app*", "ORDERS"),
        naming.recheck_durable("my.app*", 100),
        naming.ready_durable("my.app*", "ORDERS.billing"),
    ):
        assert not set(name) & {".", "*", ">", " "}, name


def test_keys_that_read_alike_never_share_a_hand_over_consumer() -> None:
    """``s_x.d`` and ``s.x_d`` read the same once consumer-name safe; their names differ."""
    assert naming.ready_durable("p", "s_x.d") != naming.ready_durable("p", "s.x_d")
    assert naming.ready_durable("p", "s_x.d").startswith("p-ready-s_x_d-")


def test_another_services_subscriber_of_the_subject_has_another_key() -> None:
    """No durable name: the key is the subject's and the handlers', not the subject's alone."""
    a = naming.key_of("ORDERS", None, "orders.*", ("billing:handle",))
    assert a == naming.key_of("ORDERS", None, "orders.*", ("billing:handle",))
    assert a != naming.key_of("ORDERS", None, "orders.*", ("shipping:handle",))
    assert naming.key_of("ORDERS", "d", "orders.*", ("x:y",)) == "ORDERS.d"


def config(**fields: object) -> SimpleNamespace:
    return SimpleNamespace(**fields)


def test_a_consumer_that_cannot_keep_a_failure_is_refused() -> None:
    """``ack_policy`` none or all: refused, with the fix; explicit passes."""
    for policy in ("none", "all"):
        [found] = checks.consumer_findings(
            "S.d", config(ack_policy=SimpleNamespace(value=policy)), 20
        )
        assert found.refuse
        assert "AckPolicy.EXPLICIT" in found.text
    assert (
        checks.consumer_findings("S.d", config(ack_policy=SimpleNamespace(value="explicit")), 20)
        == []
    )


def test_a_low_max_deliver_is_warned_of() -> None:
    """Below the delivery limit: a warning (redeliveries spend it); unset or -1: nothing."""
    [found] = checks.consumer_findings("S.d", config(max_deliver=3), 20)
    assert not found.refuse
    assert "max_deliver=3" in found.text
    assert checks.consumer_findings("S.d", config(max_deliver=-1), 20) == []
    assert checks.consumer_findings("S.d", config(max_deliver=None), 20) == []
