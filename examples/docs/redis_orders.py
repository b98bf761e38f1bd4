"""Retries on Redis Streams: RetryMiddleware and a stream in a consumer group."""

import os
import socket
from datetime import timedelta

from faststream import FastStream
from faststream.redis import RedisBroker, StreamSub

from faststream_retry import (
    Exponential,
    PermanentError,
    RetryMiddleware,
    RetryPolicy,
)

# waits 1 s, then 2 s; after the third failed attempt, a dead letter
backoff = Exponential(initial=timedelta(seconds=1), maximum=timedelta(minutes=5))
retry = RetryMiddleware(default=RetryPolicy(max_attempts=3, backoff=backoff))
broker = RedisBroker(
    os.environ.get("REDIS_URL", "redis://localhost:6379"),
    middlewares=[retry],
)
retry.install(broker)  # start with the broker: checks, mover, claimer
app = FastStream(broker)

# A name of this process's own: every replica (and every worker process of
# `faststream run --workers`) reads the group under a consumer name no other
# live process uses.
consumer = f"{socket.gethostname()}-{os.getpid()}"


async def save(order: dict[str, str]) -> None:
    """Your database: raises ConnectionError while it restarts."""


# A stream read in a consumer group: each entry stays pending until it is
# acknowledged. A pub/sub channel or a list is refused at start: a failed
# message there would have nowhere to wait.
@broker.subscriber(stream=StreamSub("orders", group="billing", consumer=consumer))
async def bill(order: dict[str, str]) -> None:
    if not order.get("customer"):
        # never retried: to the dead-letter stream at once
        raise PermanentError(f"order {order['id']} names no customer")
    await save(order)  # ConnectionError: back in 1 s, then 2 s
