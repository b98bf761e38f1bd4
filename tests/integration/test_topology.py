"""Startup checks and quorum queues on a real RabbitMQ."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from aiormq.exceptions import ChannelPreconditionFailed

from faststream_retry import Fixed, PermanentError, RetryPolicy, RetryTopologyError, headers
from faststream_retry.events import EventKind
from faststream_retry.topology import tier_name
from tests.rabbit import App, drain, eventually, headers_of, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit


async def test_existing_queues_with_other_arguments_are_named_not_a_raw_406(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Every mismatch at once, each with its queue, argument and how to migrate."""
    app: App = make_app(queue_type="quorum")
    queue = unique("mismatch")

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        raise ConnectionError(body)

    channel = await amqp.channel()
    tier = tier_name(app.prefix, 100)
    await channel.declare_queue(tier, durable=True)  # classic, no TTL
    await channel.declare_queue(f"{queue}.dlq", durable=True)
    with pytest.raises(RetryTopologyError) as caught:
        await app.start()
    text = str(caught.value)
    assert f"queue {tier!r}: argument 'x-message-ttl' is unset on the broker" in text
    assert "the plugin declares '100'" in text
    assert f"queue '{queue}.dlq': argument 'x-queue-type' is unset on the broker" in text
    assert "the plugin declares 'quorum'" in text
    assert "choose a new prefix=" in text  # the tier's advice
    assert "move its messages to a temporary queue" in text  # the DLQ's advice
    assert "PRECONDITION_FAILED" in text
    await app.broker.stop()
    for name in (tier, f"{queue}.dlq"):
        await channel.queue_delete(name)
    await channel.close()


async def test_quorum_everywhere_retries_and_dead_letters(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Every queue the plugin declares is a quorum queue, and the loop works on them."""
    app: App = make_app(
        queue_type="quorum", delivery_limit=1, default=RetryPolicy(backoff=Fixed(0.3))
    )
    queue = unique("quorum")
    calls: dict[str, int] = {}

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        calls[body] = calls.get(body, 0) + 1
        if body == "bad":
            raise PermanentError("no")
        if calls[body] < 4:
            raise TimeoutError("later")

    await app.start()
    await app.broker.publish("good", queue=queue)
    await app.broker.publish("bad", queue=queue)
    await eventually(
        lambda: any(e.kind is EventKind.RELEASED and e.attempt == 3 for e in app.events),
        what="the third release",
    )
    await eventually(lambda: calls.get("good") == 4, what="success on the 4th call")
    (dead,) = await drain(amqp, f"{queue}.dlq", expect=1)
    assert dead.body == b"bad"
    assert dead.headers[headers.REASON] == "permanent"
    await app.stop()
    # A quorum queue refuses a classic redeclaration: proof of its type.
    runtime = app.retry.runtime(app.broker)
    for spec in runtime.plan.queues:
        assert spec.arguments["x-queue-type"] == "quorum"
        channel = await amqp.channel()
        with pytest.raises(ChannelPreconditionFailed):
            await channel.declare_queue(
                spec.name, durable=True, arguments={"x-queue-type": "classic"}
            )


async def test_a_stuck_message_in_a_quorum_retry_queue_ends_in_the_dlq_at_the_limit(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """The re-check consumer requeues only when it cannot publish; at the limit, DLQ."""
    app: App = make_app(queue_type="quorum", delivery_limit=2)
    queue = unique("limit")

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        raise ConnectionError(body)

    await app.start()
    channel = await amqp.channel()
    runtime = app.retry.runtime(app.broker)
    for tier in runtime.plan.exchanges:  # every hop is now unroutable
        await channel.queue_delete(tier)
    due = int(time.time() * 1000) + 30_000
    await channel.default_exchange.publish(
        aio_pika.Message(b"stuck", headers={headers.DUE: due, headers.ATTEMPT: 1}, message_id="s1"),
        routing_key=f"{queue}.retry",
    )
    (dead,) = await drain(amqp, f"{queue}.dlq", expect=1, timeout=20)
    await app.stop()
    assert dead.body == b"stuck"
    assert dead.message_id == "s1"
    death = headers_of(dead)["x-death"][0]
    assert death["reason"] == "delivery_limit"
    assert death["queue"] == f"{queue}.retry"
    await channel.close()
