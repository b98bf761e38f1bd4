"""A handler that publishes its result: the policy goes under the subscriber."""

from faststream.rabbit import RabbitBroker
from pydantic import BaseModel

from faststream_retry import RetryMiddleware, RetryPolicy, retry_policy

retry = RetryMiddleware(default=RetryPolicy(max_attempts=5))
broker = RabbitBroker("amqp://guest:guest@localhost:5672/", middlewares=[retry])
retry.install(broker)


class Order(BaseModel):
    id: int


class Refund(BaseModel):
    order_id: int


class Receipt(BaseModel):
    id: int


async def charge(order_id: int) -> Receipt:
    """Your payment client."""
    return Receipt(id=order_id)


# --8<-- [start:both-orders]
@broker.subscriber("orders")
@broker.publisher("orders-done")
@retry_policy(max_attempts=3)
async def place(body: Order) -> Receipt:
    return await charge(body.id)


@broker.subscriber("refunds")
@retry_policy(max_attempts=3)
@broker.publisher("refunds-done")
async def refund(body: Refund) -> Receipt:
    return await charge(body.order_id)


# --8<-- [end:both-orders]
