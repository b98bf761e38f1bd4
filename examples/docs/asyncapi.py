"""Each covered queue's .dlq in the AsyncAPI document.

`faststream docs gen examples.docs.asyncapi:app` writes it.
"""

from faststream import FastStream
from faststream.rabbit import RabbitBroker, RabbitRouter
from faststream.specification import AsyncAPI
from pydantic import BaseModel

from faststream_retry import RetryMiddleware, retry_policy

# --8<-- [start:app]
retry = RetryMiddleware()
broker = RabbitBroker("amqp://guest:guest@localhost:5672/", middlewares=[retry])
router = RabbitRouter(prefix="billing.")


class Order(BaseModel):
    id: int


@broker.subscriber("orders")  # documents orders.dlq
async def take_order(order: Order) -> None: ...


@router.subscriber("invoices")  # documents billing.invoices.dlq
async def invoice(body: str) -> None: ...


@broker.subscriber("audit")  # retries off: no .dlq
@retry_policy(enabled=False)
async def audit(body: str) -> None: ...


broker.include_router(router)
app = FastStream(
    broker,
    specification=retry.asyncapi(AsyncAPI(title="Orders", version="1.0.0")),
)
# --8<-- [end:app]
