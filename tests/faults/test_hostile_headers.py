"""S1 and S2: hostile headers on a real broker, and the size of what the plugin adds."""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from aiormq.exceptions import (
    ConnectionCommandInvalid,
    ConnectionFrameError,
    ConnectionInternalError,
    ConnectionSyntaxError,
    ConnectionUnexpectedFrame,
)
from faststream.rabbit import RabbitMessage
from hypothesis import strategies as st
from pamqp.encode import field_table as encode_table

from faststream_retry import Fixed, RetryPolicy, TransientError
from faststream_retry.core import headers as h
from faststream_retry.core.events import EventKind
from tests.faults.support import DeadLetterWatch, Tally, count_late, stopped, wait_settled
from tests.rabbit import App, drain, eventually, queue_depth, unique
from tests.strategies import amqp_values, draw, hostile_headers

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

    from tests.faults.conftest import Report

pytestmark = [pytest.mark.rabbit, pytest.mark.fault, pytest.mark.timeout(400)]

EXAMPLES = 300


def encodable(headers: dict[str, Any]) -> bool:
    try:
        encode_table(headers)
    except (TypeError, ValueError, OverflowError, struct.error):
        return False  # pamqp cannot send it, so it never arrives either
    return True


# How RabbitMQ closes a connection whose frame it will not take: 501-505 for a frame it
# cannot parse, 541 INTERNAL_ERROR for a NaN or infinite float anywhere in the headers
# (Erlang has no such floats). Any other error fails the test.
REFUSALS = (
    ConnectionFrameError,
    ConnectionSyntaxError,
    ConnectionCommandInvalid,
    ConnectionUnexpectedFrame,
    ConnectionInternalError,
)


def non_finite(value: object) -> bool:
    """Whether a NaN or an infinite float hides anywhere in ``value``."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(non_finite(v) for v in value)
    return False


async def publish_pair(
    url: str, queue: str, headers: dict[str, Any], stem: str, sent: list[str]
) -> str | None:
    """Publish ``headers`` to ``queue`` and to its ``.retry``; the broker's refusal, if any.

    A connection per header set: RabbitMQ answers a table it cannot parse by closing
    the connection, and such a message never reaches a consumer.
    """
    try:
        async with await aio_pika.connect(url) as connection:
            channel = await connection.channel(publisher_confirms=True)
            for target, tag in ((queue, "w"), (f"{queue}.retry", "r")):
                await channel.default_exchange.publish(
                    aio_pika.Message(b"{}", headers=headers, message_id=f"{stem}{tag}"),
                    routing_key=target,
                )
                sent.append(f"{stem}{tag}")
    except REFUSALS as exc:
        return repr(exc)
    return None


with_trace_keys = st.one_of(
    hostile_headers,
    st.dictionaries(st.sampled_from(["traceparent", "tracestate", h.DUE]), amqp_values, max_size=3),
)
HAND_PICKED: list[dict[str, Any]] = [
    {h.ORIGIN_QUEUE: "other"},
    {h.DUE: 2**62, h.ATTEMPT: 1},
    {h.DUE: -1, h.ATTEMPT: -5},
    {h.DUE: "soon", h.ATTEMPT: "1e9"},
    {h.ATTEMPT: 2**31 + 7},
    {h.HISTORY: [{"attempt": "x"}, 5, None]},
    {"x-death": [{"queue": "other", "count": -1}], "x-first-death-queue": "other"},
    {"traceparent": "00-zz-yy-01", "tracestate": b"\xff"},
    {h.DUE: float("nan")},  # RabbitMQ refuses these two: never delivered, never lost
    {"app": [{"x": float("inf")}]},
]


async def test_hostile_headers_never_crash_misroute_or_lose(
    make_app: Any, rabbit_url: str, amqp: AbstractRobustConnection, report: Report
) -> None:
    """Each header set arrives twice, at the work queue and at its ``.retry`` queue.
    Every message ends processed or in its DLQ; the sibling queue gets nothing; the
    re-check consumer keeps consuming."""
    app: App = make_app(max_delay=2, default=RetryPolicy(max_attempts=3, backoff=Fixed(0.2)))
    queue, other = unique("s1"), unique("s1-other")
    failed_once: set[str] = set()
    tally = Tally([])
    strays: list[str | None] = []

    @app.broker.subscriber(queue)
    async def handle(msg: RabbitMessage) -> None:
        if msg.message_id not in failed_once:
            failed_once.add(msg.message_id or "?")
            raise ConnectionError("first delivery fails, so the headers are read")
        tally.processed.append(msg.message_id or "?")

    @app.broker.subscriber(other)
    async def sibling(msg: RabbitMessage) -> None:
        strays.append(msg.message_id)

    cases = [c for c in HAND_PICKED + draw(with_trace_keys, EXAMPLES) if encodable(c)]
    await app.start()
    watch = DeadLetterWatch(rabbit_url, f"{queue}.dlq", tally.dead)
    await watch.start()
    refused: dict[int, str] = {}
    try:
        for i, headers in enumerate(cases):
            refusal = await publish_pair(rabbit_url, queue, headers, f"h{i:04d}", tally.sent)
            if refusal is not None:
                refused[i] = refusal
        try:
            seconds = await wait_settled(tally, 60, "S1")
        except pytest.fail.Exception:
            lost = {m: cases[int(m[1:5])] for m in sorted(tally.lost) if m.startswith("h")}
            pytest.fail(f"lost, with their headers: {lost!r}")
        # The re-check consumer is alive: a plain retry still comes back.
        before = len(tally.processed)
        await app.broker.publish("after", queue=queue, message_id="after")
        await eventually(lambda: len(tally.processed) == before + 1, 15, "a retry after the storm")
        tally.sent.append("after")
        await stopped("stopping the app", app.stop())
        await count_late(tally, rabbit_url, [queue, *app.retry_queues(queue)], watch)
    finally:
        await stopped("closing the DLQ watch", watch.stop())
    # RabbitMQ refuses exactly the header sets with a NaN or infinite float; such a
    # message never reaches a consumer. Every other set must have been delivered.
    expected = {i for i, headers in enumerate(cases) if non_finite(headers)}
    unexplained = {i: (cases[i], refused[i]) for i in set(refused) - expected}
    assert not unexplained, f"refused by RabbitMQ, for no known reason: {unexplained!r}"
    assert set(refused) == expected, (
        f"expected refusals that did not happen: {expected - set(refused)}"
    )
    assert tally.lost == set()
    assert tally.duplicates == 0
    assert set(tally.processed) & set(tally.dead) == set()
    assert strays == []
    for name in (queue, f"{queue}.retry"):
        assert await queue_depth(amqp, name) == 0
    reasons = {e.reason for e in app.events if e.kind is EventKind.DEAD_LETTERED}
    assert reasons <= {"exhausted", "invalid"}
    report.add(
        "S1 hostile headers",
        f"{len(cases) - len(refused)} header sets (hypothesis + hand-picked), each at the queue "
        f"and at .retry ({len(refused)} more refused by RabbitMQ itself)",
        tally,
        seconds,
    )


async def test_added_headers_stay_bounded_after_100_retries(
    make_app: Any, amqp: AbstractRobustConnection, report: Report
) -> None:
    """One message fails 100 times with a long error; every copy, the dead letter
    included, carries at most ``headers.MAX_ADDED_BYTES`` of the plugin's headers."""
    app: App = make_app(tick=0.1, default=RetryPolicy(max_attempts=101, backoff=Fixed(0.1)))
    queue = unique("s2")
    app_headers: dict[str, Any] = {"tenant": "acme", "trace": "x" * 100}
    base = len(encode_table(app_headers))
    added: list[int] = []

    @app.broker.subscriber(queue)
    async def handle(msg: RabbitMessage) -> None:
        added.append(len(encode_table(dict(msg.headers))) - base)
        raise TransientError("é" * 20_000)  # far beyond every field's limit

    await app.start()
    await app.broker.publish("x", queue=queue, headers=app_headers)
    await eventually(lambda: len(added) == 101, 60, "101 deliveries")
    (dead,) = await drain(amqp, f"{queue}.dlq", expect=1)
    dead_added = len(encode_table(dict(dead.headers))) - base
    assert dead.headers[h.REASON] == "exhausted"
    assert dead.headers[h.ATTEMPT] == 101
    assert max(added) <= h.MAX_ADDED_BYTES
    assert dead_added <= h.MAX_ADDED_BYTES
    assert {k: dead.headers[k] for k in app_headers} == app_headers
    report.note(
        f"S2 bounds: after 100 retries the plugin's headers take at most {max(added)} bytes "
        f"on a retry copy and {dead_added} on the dead letter (budget {h.MAX_ADDED_BYTES})"
    )
