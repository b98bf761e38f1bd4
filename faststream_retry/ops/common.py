"""What every operation shares: the connection, the error type, queue names."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import aio_pika
from aiormq.exceptions import ChannelNotFoundEntity

from faststream_retry.topology import dlq_name

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from aio_pika.abc import AbstractConnection

__all__ = ["DEFAULT_URL", "OperationError", "QueueDepth", "connect", "depth", "dlq_of"]

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"
CONNECT_TIMEOUT_S = 10.0


class OperationError(Exception):
    """An operation could not be done as asked; the text says why and what to do."""


@asynccontextmanager
async def connect(
    url: str, timeout: float = CONNECT_TIMEOUT_S
) -> AsyncIterator[AbstractConnection]:
    """Open a plain (not robust) connection to ``url`` and close it on exit.

    Not robust on purpose: an operator's command should fail at once and say so
    rather than reconnect behind a half-done move.

    Raises:
        OperationError: the broker cannot be reached or refused the login.
    """
    try:
        connection = await aio_pika.connect(url, timeout=timeout)
    except Exception as exc:  # any failure to connect is the same answer to an operator
        raise OperationError(
            f"cannot connect to {_safe(url)}: {exc or type(exc).__name__}"
        ) from exc
    try:
        yield connection
    finally:
        await connection.close()


def _safe(url: str) -> str:
    """Return ``url`` without its password, for error texts."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not sep or not at:
        return url
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


def dlq_of(queue: str) -> str:
    """Return the dead-letter queue meant by ``queue``: a work queue or a ``.dlq`` itself."""
    return queue if queue.endswith(".dlq") else dlq_name(queue)


class QueueDepth:
    """What a passive declare tells about a queue."""

    __slots__ = ("consumers", "messages", "name")

    def __init__(self, name: str, messages: int, consumers: int) -> None:
        """Record the counts of ``name``."""
        self.name = name
        self.messages = messages
        self.consumers = consumers


async def depth(connection: AbstractConnection, queue: str) -> QueueDepth | None:
    """Return the ready messages and consumers of ``queue``; ``None`` if it does not exist."""
    # A channel per look: a missing queue closes the channel it was asked on.
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
    except ChannelNotFoundEntity:
        return None
    finally:
        if not channel.is_closed:
            await channel.close()
    result = declared.declaration_result
    return QueueDepth(queue, result.message_count or 0, result.consumer_count or 0)
