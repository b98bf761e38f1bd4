"""A consumer of dead letters that alerts a human, and never loses one."""

import os

from faststream import AckPolicy
from faststream.rabbit import QueueType, RabbitBroker, RabbitMessage, RabbitQueue

from faststream_retry import PermanentError, RetryMiddleware, retry_policy

retry = RetryMiddleware()
broker = RabbitBroker(
    os.environ.get("RABBITMQ_URL", "amqp://guest:guest@localhost:5672/"),
    middlewares=[retry],
)
retry.install(broker)


async def alert_on_call(body: bytes, reason: str, error: str) -> None:
    """Your pager: Slack, Opsgenie, an incident ticket."""


@broker.subscriber("orders")
async def take_order(body: dict[str, int]) -> None:
    # Permanent: straight to orders.dlq, with no retry.
    raise PermanentError(f"order {body['id']} names no customer")


# --8<-- [start:consumer]
@broker.subscriber(
    # Declared as the plugin declares it (durable, the plugin's queue
    # type): RabbitMQ refuses a second declaration with other arguments.
    RabbitQueue("orders.dlq", durable=True, queue_type=QueueType.QUORUM),
    # A failure here must leave the dead letter where it is.
    ack_policy=AckPolicy.MANUAL,
)
@retry_policy(enabled=False)  # a dead letter is not retried again
async def on_dead_letter(msg: RabbitMessage) -> None:
    # No body parameter: FastStream would decode the body into its type,
    # and a dead letter that does not fit (a JSON object into `bytes`, say)
    # would never reach here.
    # msg.body is the raw bytes, whatever the producer sent.
    headers = msg.headers
    await alert_on_call(
        msg.body,
        str(headers["retry-reason"]),
        str(headers.get("retry-error", "")),
    )
    await msg.ack()  # only once it is handled


# --8<-- [end:consumer]
