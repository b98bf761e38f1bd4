"""The smallest app: one middleware, and every handler of the broker retries."""

from faststream import FastStream
from faststream.rabbit import RabbitBroker

from faststream_retry import RetryMiddleware

retry = RetryMiddleware()  # 5 attempts, 1 s doubling to 5 min, quorum queues
broker = RabbitBroker("amqp://guest:guest@localhost:5672/", middlewares=[retry])
app = FastStream(broker)


async def save(order: str) -> None:
    """Your database."""


@broker.subscriber("orders")
async def handle(order: str) -> None:
    # Raises while the database restarts: back in 1 s, then 2 s, ...
    await save(order)
