"""The notification service: one fanout exchange, an email queue and a webhook queue.

This module is the service as a user writes it: a broker, the retry middleware and
two handlers. ``run.py`` drives it for the demo. The outside world is simulated:
the SMTP server is down for the first seconds, one address is invalid, some webhook
payloads carry no valid URL, one webhook endpoint always answers 503 and another
rate-limits once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta

from faststream.rabbit import ExchangeType, RabbitBroker, RabbitExchange, RabbitQueue
from faststream.rabbit.opentelemetry import RabbitTelemetryMiddleware
from pydantic import BaseModel, HttpUrl

from faststream_retry import (
    Exponential,
    PermanentError,
    RetryLater,
    RetryMiddleware,
    RetryPolicy,
    TransientError,
    retry_policy,
)

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5673/")

retry = RetryMiddleware(
    default=RetryPolicy(
        max_attempts=4,
        backoff=Exponential(
            initial=timedelta(milliseconds=500), factor=2, maximum=timedelta(seconds=4)
        ),
    ),
    max_delay=timedelta(minutes=1),
)
# FastStream's own telemetry outside, the retry middleware inside: our spans nest
# under its process span, and one notification is one trace, retries included.
broker = RabbitBroker(RABBITMQ_URL, middlewares=[RabbitTelemetryMiddleware(), retry], logger=None)
retry.install(broker)

notifications = RabbitExchange("notification-exchange", type=ExchangeType.FANOUT)


class SMTPDownError(ConnectionError):
    """The mail server refused the connection."""


class InvalidAddressError(Exception):
    """The address can never receive mail."""


class Email(BaseModel):
    id: int
    email: str


class Webhook(BaseModel):
    id: int
    webhook_url: HttpUrl


class World:
    """The simulated outside world, and what the handlers managed to do."""

    def __init__(self) -> None:
        self.on_delivered: Callable[[str, int], None] = lambda _queue, _id: None
        self.reset()

    def reset(self, smtp_down_for: float = 2.5) -> None:
        """Start the SMTP outage now and forget what was delivered."""
        self.smtp_up_at = time.monotonic() + smtp_down_for
        self.rate_limited: set[int] = set()
        self.delivered: dict[str, list[int]] = {"email-queue": [], "webhook-queue": []}

    def deliver(self, queue: str, id_: int) -> None:
        self.delivered[queue].append(id_)
        self.on_delivered(queue, id_)


world = World()


@broker.subscriber(RabbitQueue("email-queue"), notifications)
@retry_policy(max_attempts=6, transient=(SMTPDownError,), permanent=(InvalidAddressError,))
async def send_email(body: Email) -> None:
    """Send one email; SMTP trouble is transient, a bad address is permanent."""
    if not body.email.endswith("@example.com"):
        raise InvalidAddressError(f"{body.email} is not deliverable")
    if time.monotonic() < world.smtp_up_at:
        raise SMTPDownError("connection refused by smtp.example.com:25")
    world.deliver("email-queue", body.id)


@broker.subscriber(RabbitQueue("webhook-queue"), notifications)
async def call_webhook(body: Webhook) -> None:
    """POST to the user's webhook; a payload without a valid URL never validates."""
    host = body.webhook_url.host or ""
    if host.startswith("down."):
        raise TransientError(f"{host} answered 503 Service Unavailable")
    if host.startswith("busy.") and body.id not in world.rate_limited:
        world.rate_limited.add(body.id)
        raise RetryLater(delay=timedelta(seconds=1), reason=f"{host} answered 429, Retry-After: 1")
    if host.startswith("broken."):
        raise PermanentError(f"{host} answered 410 Gone")
    world.deliver("webhook-queue", body.id)
