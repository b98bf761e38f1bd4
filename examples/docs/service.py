"""The quickstart: a notification service with two retrying handlers."""

from datetime import timedelta
from smtplib import SMTPException

from faststream import FastStream
from faststream.rabbit import RabbitBroker

from faststream_retry import (
    Exponential,
    RetryLater,
    RetryMiddleware,
    RetryPolicy,
    retry_policy,
)

from .clients import deliver, post

retry = RetryMiddleware(
    default=RetryPolicy(
        max_attempts=5,
        backoff=Exponential(
            initial=timedelta(seconds=1), factor=2, maximum=timedelta(minutes=5)
        ),
    )
)
broker = RabbitBroker("amqp://guest:guest@localhost:5672/", middlewares=[retry])
retry.install(broker)  # optional: start with the broker, not its first message
app = FastStream(broker)


class InvalidAddress(Exception):
    """The address can never take mail: retrying will not help."""


@broker.subscriber("email-queue")
@retry_policy(
    max_attempts=8, transient=(SMTPException,), permanent=(InvalidAddress,)
)
async def send_email(body: dict[str, str]) -> None:
    if "@" not in body["to"]:
        raise InvalidAddress(body["to"])
    await deliver(body["to"], body["text"])


@broker.subscriber("webhook-queue")
async def call_webhook(body: dict[str, str]) -> None:
    response = await post(body["url"], body)
    if response.status_code == 429:
        raise RetryLater(
            delay=timedelta(seconds=int(response.headers["Retry-After"]))
        )
    response.raise_for_status()
