"""Test mode under TestRedisBroker: a stream subscriber, no Redis server."""

# --8<-- [start:app]
import pytest
from faststream.redis import (
    RedisBroker,
    RedisStreamMessage,
    StreamSub,
    TestRedisBroker,
)

from faststream_retry import (
    Exponential,
    PermanentError,
    RetryMiddleware,
    RetryPolicy,
    retry_policy,
)

retry = RetryMiddleware(
    default=RetryPolicy(max_attempts=3, backoff=Exponential(initial=1, factor=2))
)
broker = RedisBroker("redis://localhost:6379", middlewares=[retry])
outages: list[Exception] = []  # failures the warehouse will answer with


@broker.subscriber(stream=StreamSub("orders", group="shipping", consumer="c1"))
async def ship(order: dict[str, object]) -> None:
    if "sku" not in order:
        raise PermanentError("an order without a sku")
    if outages:
        raise outages.pop()


# --8<-- [end:app]


# --8<-- [start:retried]
@pytest.mark.asyncio
async def test_a_warehouse_outage_is_retried() -> None:
    outages[:] = [ConnectionError("warehouse down")] * 2
    async with TestRedisBroker(broker) as br:
        with retry.testing() as recorder:
            await br.publish({"sku": "A-1"}, stream="orders")
    assert [e.delay_ms for e in recorder.scheduled] == [1000, 2000]
    assert recorder.dead_letters == []


# --8<-- [end:retried]


# --8<-- [start:dead_letter]
@pytest.mark.asyncio
async def test_an_order_without_a_sku_reaches_the_dead_letter_stream() -> None:
    letters = []
    errors = []

    # The dead letters of stream "orders" are in "{orders}.dlq".
    @broker.subscriber(stream="{orders}.dlq", persistent=False)
    @retry_policy(enabled=False)
    async def read_dead_letter(msg: RedisStreamMessage) -> None:
        h = msg.headers  # text, as the stream holds them
        letters.append((msg.body, h["retry-reason"], h["retry-attempt"]))
        errors.append(h["retry-error"])

    async with TestRedisBroker(broker) as br:
        with retry.testing():
            await br.publish({"id": 7}, stream="orders")
    assert letters == [(b'{"id":7}', "permanent", "1")]
    assert errors == ["an order without a sku"]


# --8<-- [end:dead_letter]
