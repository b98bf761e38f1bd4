"""FastAPI with faststream-fastapi: the app's lifespan starts the broker."""

from fastapi import FastAPI
from faststream.rabbit import RabbitBroker
from faststream_fastapi import FastStreamAPI
from pydantic import BaseModel

from faststream_retry import RetryMiddleware, RetryPolicy, retry_policy


class Order(BaseModel):
    id: int


async def reserve_stock(order: Order) -> None:
    """Your inventory client."""


retry = RetryMiddleware(default=RetryPolicy(max_attempts=5))
broker = RabbitBroker("amqp://guest:guest@localhost:5672/", middlewares=[retry])
retry.install(broker)


@broker.subscriber("orders")
@retry_policy(max_attempts=3)
async def take_order(order: Order) -> None:
    await reserve_stock(order)


# After the subscribers: FastStreamAPI adapts those the broker has now.
app = FastStreamAPI(broker, application=FastAPI())  # uvicorn module:app
