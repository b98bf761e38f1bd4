"""NATS JetStream: a router with a prefix, per-handler policies, dead letters."""

import json
import os
from datetime import timedelta

from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsMessage, NatsRouter, PullSub

from faststream_retry import Fixed, RetryMiddleware, RetryPolicy, retry_policy

retry = RetryMiddleware(
    default=RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(seconds=1)))
)
broker = NatsBroker(os.environ.get("NATS_URL", "nats://localhost:4222"))


class InvalidAddress(Exception):
    """The address can never take mail: retrying will not help."""


async def send_mail(invoice: dict[str, str]) -> None:
    """Your mail client: raises ConnectionError while the server is down."""


async def book(invoice: dict[str, str]) -> None:
    """Your ledger."""


# --8<-- [start:router]
# The prefix is part of each subscriber's subject: billing.invoices.issued
router = NatsRouter(prefix="billing.", middlewares=[retry])
invoices = JStream("invoices", subjects=["billing.invoices.>"])


@router.subscriber(
    "invoices.issued", stream=invoices, durable="mailer", pull_sub=PullSub()
)
@retry_policy(max_attempts=5, permanent=(InvalidAddress,))
async def mail_invoice(invoice: dict[str, str]) -> None:
    if "@" not in invoice["email"]:
        raise InvalidAddress(invoice["email"])
    await send_mail(invoice)


@router.subscriber(
    "invoices.paid", stream=invoices, durable="ledger", pull_sub=PullSub()
)
async def book_payment(invoice: dict[str, str]) -> None:  # the default policy
    await book(invoice)


broker.include_router(router)
retry.install(broker)  # once, on the broker: it covers the router too
# --8<-- [end:router]


async def alert_on_call(body: bytes, reason: str, error: str) -> None:
    """Your pager: Slack, Opsgenie, an incident ticket."""


# --8<-- [start:consumer]
@broker.subscriber(
    "retry.dlq.invoices.>",  # the dead letters of every consumer of "invoices"
    # The plugin makes this stream; declare=False keeps FastStream from
    # updating it to a config of its own (which turns direct gets off).
    stream=JStream("retry-dlq-invoices", declare=False),
    durable="on-call",
    pull_sub=PullSub(),
    ack_policy=AckPolicy.MANUAL,  # not acked: redelivered after ack_wait
)
@retry_policy(enabled=False)  # a dead letter is not retried again
async def on_dead_letter(msg: NatsMessage) -> None:
    # No body parameter: msg.body is the raw bytes, whatever failed.
    # On NATS a retry-* header's value is JSON text: '"exhausted"', '5'.
    headers = msg.headers
    await alert_on_call(
        msg.body,
        json.loads(headers["retry-reason"]),
        json.loads(headers.get("retry-error", '""')),
    )
    await msg.ack()  # the dead letter stays in the stream: acking moves nothing


# --8<-- [end:consumer]
