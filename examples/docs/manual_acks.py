"""A MANUAL-ack handler with the plugin's backoff: it raises unsettled."""

from faststream import AckPolicy
from faststream.rabbit import RabbitBroker, RabbitMessage

from faststream_retry import RetryMiddleware, retry_policy

retry = RetryMiddleware()
broker = RabbitBroker("amqp://guest:guest@localhost:5672/", middlewares=[retry])
retry.install(broker)


async def store(body: dict[str, int]) -> None:
    """Your database."""


# --8<-- [start:handler]
@broker.subscriber("payments", ack_policy=AckPolicy.MANUAL)
@retry_policy(max_attempts=5)
async def record_payment(body: dict[str, int], msg: RabbitMessage) -> None:
    await store(body)  # raises while the database is down: retried with backoff
    await msg.ack()  # only once it is stored
    # Not `except: await msg.nack(); raise`: a settled message is the handler's
    # decision, and a nack requeues it at once, with no backoff.


# --8<-- [end:handler]
