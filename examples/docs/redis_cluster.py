"""Redis Cluster: RedisClusterBroker, and one hash tag per tenant."""

import os
import socket

from faststream.redis import RedisClusterBroker, StreamSub

from faststream_retry import RetryMiddleware

retry = RetryMiddleware()
broker = RedisClusterBroker(
    os.environ.get("REDIS_CLUSTER_URL", "redis://localhost:7000"),
    middlewares=[retry],
)
retry.install(broker)  # the plugin's own client: a cluster client, same settings
me = f"{socket.gethostname()}-{os.getpid()}"


async def save(order: dict[str, str]) -> None:
    """Your database."""


async def refund(order: dict[str, str]) -> None:
    """Your payment provider."""


# One tag, one slot: both streams, and every key the plugin derives from them
# ({tenant-7}.orders.retry, {tenant-7}.refunds.dlq, ...), live on one node.
@broker.subscriber(
    stream=StreamSub("{tenant-7}.orders", group="billing", consumer=me)
)
async def bill(order: dict[str, str]) -> None:
    await save(order)


@broker.subscriber(
    stream=StreamSub("{tenant-7}.refunds", group="billing", consumer=me)
)
async def pay_back(order: dict[str, str]) -> None:
    await refund(order)
