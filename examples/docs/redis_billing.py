"""Redis Streams: a router with a prefix, policies, claim_idle, dead letters."""

import os
import socket
from datetime import timedelta

from faststream.redis import (
    RedisBroker,
    RedisRouter,
    RedisStreamMessage,
    StreamSub,
)

from faststream_retry import Fixed, RetryMiddleware, RetryPolicy, retry_policy

# --8<-- [start:middleware]
retry = RetryMiddleware(
    default=RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(seconds=1))),
    # A replica killed mid-message leaves its entries pending: after 30 s
    # without its keep-alive, any replica claims them (one failed attempt).
    claim_idle=timedelta(seconds=30),
)
broker = RedisBroker(
    os.environ.get("REDIS_URL", "redis://localhost:6379"), middlewares=[retry]
)
retry.install(broker)
# Every live process reads under names of its own.
me = f"{socket.gethostname()}-{os.getpid()}"
# --8<-- [end:middleware]


class InvalidAddress(Exception):
    """The address can never take mail: retrying will not help."""


async def send_mail(invoice: dict[str, str]) -> None:
    """Your mail client: raises ConnectionError while the server is down."""


async def book(invoice: dict[str, str]) -> None:
    """Your ledger."""


async def alert_on_call(body: bytes, reason: str, error: str) -> None:
    """Your pager."""


# --8<-- [start:router]
# The prefix is part of each stream's name: billing.invoices.issued
router = RedisRouter(prefix="billing.")


@router.subscriber(
    stream=StreamSub("invoices.issued", group="mailer", consumer=me)
)
@retry_policy(max_attempts=5, permanent=(InvalidAddress,))
async def mail_invoice(invoice: dict[str, str]) -> None:
    if "@" not in invoice["email"]:
        raise InvalidAddress(invoice["email"])  # at once to the dead letters
    await send_mail(invoice)  # ConnectionError: 5 attempts, 1 s apart


@router.subscriber(stream=StreamSub("invoices.paid", group="ledger", consumer=me))
async def book_payment(invoice: dict[str, str]) -> None:
    await book(invoice)  # the default: 3 attempts, 1 s apart


broker.include_router(router)
# --8<-- [end:router]


# --8<-- [start:consumer]
# The mailer's dead letters, read in a group of their own, retries off.
dead_letters = StreamSub(
    "{billing.invoices.issued}.dlq", group="on-call", consumer=me
)


@broker.subscriber(stream=dead_letters)
@retry_policy(enabled=False)
async def page_someone(msg: RedisStreamMessage) -> None:
    # No body parameter: a dead letter is whatever failed, its raw bytes here.
    headers = msg.headers  # every retry-* value is text on Redis
    await alert_on_call(msg.body, headers["retry-reason"], headers["retry-error"])


# --8<-- [end:consumer]
