"""A quorum work queue whose delivery limit ends in its DLQ, not in a drop."""

from faststream.rabbit import QueueType, RabbitBroker, RabbitQueue

from faststream_retry import RetryMiddleware

retry = RetryMiddleware()
broker = RabbitBroker("amqp://guest:guest@localhost:5672/", middlewares=[retry])
retry.install(broker)

# --8<-- [start:queue]
orders = RabbitQueue(
    "orders",
    durable=True,
    queue_type=QueueType.QUORUM,
    arguments={
        "x-delivery-limit": 5,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "orders.dlq",
    },
)
# --8<-- [end:queue]


@broker.subscriber(orders)
async def take_order(body: dict[str, int]) -> None: ...
