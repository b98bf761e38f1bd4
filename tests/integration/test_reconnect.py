"""After the broker drops the connection, the plugin's topology and consumers come back."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractRobustConnection
from faststream.rabbit import RabbitMessage
from pamqp.commands import Basic

from faststream_retry import Fixed, RetryPolicy
from faststream_retry.core import headers
from faststream_retry.core.topology import tier_name
from faststream_retry.rabbit.publisher import Outcome
from tests.rabbit import (
    App,
    close_all_connections,
    eventually,
    queue_depth,
    script_broker_ctl,
    unique,
)

pytestmark = pytest.mark.rabbit


@pytest.mark.exclusive
async def test_topology_is_declared_again_after_a_reconnect(
    rabbit_url: str, make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """A tier queue deleted while the connection is down exists again after the reconnect."""
    ctl = script_broker_ctl(rabbit_url)
    if ctl is None:
        pytest.skip("needs the broker of scripts/rabbitmq/start.sh to close connections")
    app: App = make_app(default=RetryPolicy(backoff=Fixed(0.1)))
    queue = unique("reconnect")
    calls = 0

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("down")

    await app.start()
    connection = await app.broker.connect()
    reconnected = asyncio.Event()
    connection.reconnect_callbacks.add(lambda *_: reconnected.set())
    base_tier = tier_name(app.prefix, 100)
    channel = await amqp.channel()
    await channel.queue_delete(base_tier)
    await channel.close()

    await close_all_connections(ctl, "test: drop the app")
    await asyncio.wait_for(reconnected.wait(), timeout=30)
    # The test's own inspection connection was closed too; it reconnects by itself.
    await eventually(lambda: not amqp.is_closed, timeout=30, what="the test connection")

    async def tier_is_back() -> bool:
        try:
            await queue_depth(amqp, base_tier)
        except Exception:
            return False
        return True

    for _ in range(300):
        if await tier_is_back():
            break
        await asyncio.sleep(0.05)
    assert await tier_is_back(), "the tier queue was not declared again"

    # And the loop works end to end on the restored channels.
    await app.broker.publish("after", queue=queue)
    await eventually(lambda: calls == 2, timeout=20, what="the retried call after reconnect")


async def _retry_round_trip(app: App, queue: str, calls: list[str], body: str) -> None:
    """Publish ``body``; its first call fails transiently; wait for the second."""
    await app.broker.publish(body, queue=queue)
    await eventually(lambda: calls.count(body) == 2, timeout=20, what=f"{body} retried")


def _flaky_app(make_app: Any) -> tuple[App, str, list[str]]:
    app: App = make_app(default=RetryPolicy(backoff=Fixed(0.1)))
    queue = unique("heal")
    calls: list[str] = []

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        calls.append(body)
        if calls.count(body) == 1:
            raise ConnectionError("down")

    return app, queue, calls


async def test_a_publish_channel_the_broker_closes_is_reopened(make_app: Any) -> None:
    """A channel error on the plugin's publish channel (here a 404) does not stop retries."""
    app, queue, calls = _flaky_app(make_app)
    await app.start()
    live = app.retry.runtime(app.broker).live
    assert live is not None
    await _retry_round_trip(app, queue, calls, "before")
    opened = live.channels.generation
    # Publishing to a missing exchange makes the broker close the channel.
    outcome = await live.publisher.publish(
        exchange=unique("missing"), routing_key="", body=b"", properties=Basic.Properties()
    )
    assert outcome is Outcome.FAILED
    await eventually(
        lambda: live.channels.generation > opened and live.channels.ready,
        timeout=20,
        what="the publish channel reopened",
    )
    await _retry_round_trip(app, queue, calls, "after")


async def test_a_consume_channel_the_broker_closes_is_reopened(make_app: Any) -> None:
    """A channel error on the re-check consumer's channel: the consumer comes back."""
    app, queue, calls = _flaky_app(make_app)
    await app.start()
    live = app.retry.runtime(app.broker).live
    assert live is not None
    opened = live.channels.generation
    old = live.channels.consume_channel
    assert old is not None
    # Acking a delivery tag the broker never sent closes the channel (406).
    underlay = await old.get_underlay_channel()
    await underlay.basic_ack(delivery_tag=424242)
    await eventually(
        lambda: live.channels.generation > opened and live.channels.ready,
        timeout=20,
        what="the consume channel reopened",
    )
    await _retry_round_trip(app, queue, calls, "after")


async def test_a_deleted_retry_queue_is_declared_and_consumed_again(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Deleting ``<queue>.retry`` cancels its consumer; the plugin declares and consumes it again."""
    app, queue, calls = _flaky_app(make_app)
    await app.start()
    live = app.retry.runtime(app.broker).live
    assert live is not None
    opened = live.channels.generation
    channel = await amqp.channel()
    await channel.queue_delete(f"{queue}.retry")
    await channel.close()
    await eventually(
        lambda: live.channels.generation > opened and live.channels.ready,
        timeout=20,
        what="the channels reopened",
    )
    await _retry_round_trip(app, queue, calls, "after")


async def test_a_retry_queue_deleted_under_its_releases_loses_none_in_flight(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """An operator deletes ``<queue>.retry`` while the re-check consumer releases from it.

    What was ready in it goes with it (RabbitMQ's delete says how many). The deliveries
    in flight have no other copy any more: their releases must still be confirmed, on the
    old channels, which the reopen keeps open for that. Every other message arrives, once.
    """
    # Many deliveries in flight at once: the re-check consumer's window is wide open.
    app: App = make_app(prefetch=1000)
    queue = unique("deleted-under")
    arrived: list[str] = []

    @app.broker.subscriber(queue)
    async def handle(body: str, msg: RabbitMessage) -> None:
        arrived.append(msg.message_id or "?")

    await app.start()
    live = app.retry.runtime(app.broker).live
    assert live is not None
    opened = live.channels.generation
    channel = await amqp.channel(publisher_confirms=True)
    ids = [f"r{i:04d}" for i in range(2000)]
    due = int(time.time() * 1000)
    await asyncio.gather(
        *(
            channel.default_exchange.publish(
                aio_pika.Message(
                    b"x", message_id=mid, headers={headers.DUE: due, headers.ATTEMPT: 1}
                ),
                routing_key=f"{queue}.retry",
            )
            for mid in ids
        )
    )
    await eventually(lambda: len(arrived) >= 100, what="releases under way")
    deleted = (await channel.queue_delete(f"{queue}.retry")).message_count or 0
    await eventually(
        lambda: live.channels.generation > opened and live.channels.ready,
        what="the channels reopened",
    )
    await eventually(
        lambda: len(set(arrived)) + deleted >= len(ids),
        timeout=30,
        what=f"every message not deleted with the queue ({deleted} were)",
    )
    assert len(arrived) == len(set(arrived)) == len(ids) - deleted
    await channel.close()
