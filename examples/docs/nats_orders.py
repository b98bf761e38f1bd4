"""Retries on NATS JetStream: RetryMiddleware and a JetStream subscriber."""

import os
from datetime import timedelta

from faststream import FastStream
from faststream.nats import JStream, NatsBroker, PullSub

from faststream_retry import (
    Exponential,
    PermanentError,
    RetryMiddleware,
    RetryPolicy,
)

# waits 1 s, then 2 s; after the third failed attempt, a dead letter
backoff = Exponential(initial=timedelta(seconds=1), maximum=timedelta(minutes=5))
retry = RetryMiddleware(default=RetryPolicy(max_attempts=3, backoff=backoff))
broker = NatsBroker(
    os.environ.get("NATS_URL", "nats://localhost:4222"),
    middlewares=[retry],
)
retry.install(broker)  # start with the broker: checks, streams, waiting copies
app = FastStream(broker)

# JetStream keeps the orders (file storage): a core-NATS subscriber, with no
# stream, is refused at start, since a failed message would have nowhere to wait.
orders = JStream("orders", subjects=["orders.>"])


async def save(order: dict[str, str]) -> None:
    """Your database: raises ConnectionError while it restarts."""


@broker.subscriber(
    "orders.created", stream=orders, durable="billing", pull_sub=PullSub()
)
async def bill(order: dict[str, str]) -> None:
    if not order.get("customer"):
        # never retried: to the dead-letter stream at once
        raise PermanentError(f"order {order['id']} names no customer")
    await save(order)  # ConnectionError: back in 1 s, then 2 s
