"""FastAPI with FastStream's own RabbitRouter (deprecated since 0.7.8)."""

import warnings

from fastapi import FastAPI
from pydantic import BaseModel

from faststream_retry import RetryMiddleware, RetryPolicy, retry_policy

with (
    warnings.catch_warnings()
):  # 0.7.8 and later warn that it moved to faststream-fastapi
    warnings.simplefilter("ignore")
    from faststream.rabbit.fastapi import RabbitRouter


class Order(BaseModel):
    id: int


async def reserve_stock(order: Order) -> None:
    """Your inventory client."""


# --8<-- [start:router]
retry = RetryMiddleware(default=RetryPolicy(max_attempts=5))
router = RabbitRouter("amqp://guest:guest@localhost:5672/", middlewares=[retry])
retry.install(router.broker)


@router.subscriber("orders")
@retry_policy(max_attempts=3)
async def take_order(order: Order) -> None:
    await reserve_stock(order)


app = FastAPI()
app.include_router(router)  # brings the router's lifespan: it starts the broker
# --8<-- [end:router]
