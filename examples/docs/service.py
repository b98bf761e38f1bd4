"""The quickstart: a notification service with two retrying handlers."""

import asyncio
import json
import os
from datetime import timedelta
from email.message import EmailMessage
from smtplib import SMTP, SMTPException
from urllib.error import HTTPError
from urllib.request import Request, urlopen

from faststream import FastStream
from faststream.rabbit import RabbitBroker

from faststream_retry import (
    Exponential,
    PermanentError,
    RetryLater,
    RetryMiddleware,
    RetryPolicy,
    retry_policy,
)

# waits 1 s, 2 s, 4 s, ... at most 5 min; 5 attempts unless a handler says
backoff = Exponential(initial=timedelta(seconds=1), maximum=timedelta(minutes=5))
retry = RetryMiddleware(default=RetryPolicy(max_attempts=5, backoff=backoff))
broker = RabbitBroker(
    os.environ.get("RABBITMQ_URL", "amqp://guest:guest@localhost:5672/"),
    middlewares=[retry],
)
retry.install(broker)  # optional: start with the broker, not its first message
app = FastStream(broker)


class InvalidAddress(Exception):
    """The address can never take mail: retrying will not help."""


async def deliver(to: str, text: str) -> None:
    """Send one mail through the SMTP server at $SMTP_HOST (default localhost)."""
    mail = EmailMessage()
    mail["From"], mail["To"], mail["Subject"] = "noreply@example.com", to, "Hi"
    mail.set_content(text)

    def send() -> None:
        with SMTP(os.environ.get("SMTP_HOST", "localhost"), timeout=10) as smtp:
            smtp.send_message(mail)

    await asyncio.to_thread(send)


async def post(url: str, body: dict[str, str]) -> None:
    """POST ``body`` as JSON; an error status raises ``HTTPError``."""
    if not url.startswith(("https://", "http://")):
        raise PermanentError(f"not a web address: {url!r}")
    data = json.dumps(body).encode()
    request = Request(url, data, {"Content-Type": "application/json"})  # noqa: S310
    await asyncio.to_thread(lambda: urlopen(request, timeout=10).close())  # noqa: S310


@broker.subscriber("email-queue")
@retry_policy(
    max_attempts=8, transient=(SMTPException,), permanent=(InvalidAddress,)
)
async def send_email(body: dict[str, str]) -> None:
    if "@" not in body["to"]:
        raise InvalidAddress(body["to"])
    await deliver(body["to"], body["text"])  # SMTP down: ConnectionError, retried


@broker.subscriber("webhook-queue")
async def call_webhook(body: dict[str, str]) -> None:
    try:
        await post(body["url"], body)
    except HTTPError as error:
        if error.code == 429:  # rate limited: come back when the server says
            wait = timedelta(seconds=int(error.headers["Retry-After"]))
            raise RetryLater(delay=wait) from error
        raise
