"""What every operation shares: the connection, the error type, queue names."""

from __future__ import annotations

import contextlib
import hashlib
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import aio_pika
from aiormq.exceptions import (
    AMQPError,
    ChannelAccessRefused,
    ChannelLockedResource,
    ChannelNotFoundEntity,
)

from faststream_retry.topology import dlq_name

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from aio_pika.abc import AbstractConnection

__all__ = [
    "DEFAULT_URL",
    "OperationError",
    "QueueDepth",
    "connect",
    "connect_failure",
    "depth",
    "dlq_of",
    "exclusive",
    "lock_name",
    "plain_classic",
    "safe_url",
]

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
    if not url.startswith(("amqp://", "amqps://")):
        raise OperationError(f"the broker's URL starts amqp:// or amqps://, got {safe_url(url)}")
    try:
        connection = await aio_pika.connect(url, timeout=timeout)
    except Exception as exc:  # any failure to connect is the same answer to an operator
        raise OperationError(connect_failure(url, exc)) from exc
    try:
        yield connection
    finally:
        await connection.close()


def connect_failure(url: str, exc: BaseException) -> str:
    """Say, in one line without the password, why connecting to ``url`` failed."""
    return f"cannot connect to {safe_url(url)}: {_why(exc)}"


def _why(exc: BaseException) -> str:
    """Say why a connection failed, in words: the broker's reason for closing it, if any."""
    text = str(exc) or type(exc).__name__
    if "Connection.Close" in text or "Connection.OpenOk" in text:
        return (
            "the broker closed the connection while opening it: check the user, the "
            "password and the vhost (the URL's path: / is %2F) and its permissions"
        )
    return text


def safe_url(url: str) -> str:
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


async def plain_classic(connection: AbstractConnection, queue: str) -> bool:
    """Return whether ``queue`` is known to be a classic queue, where a requeue costs nothing.

    Known by declaring it with ``x-queue-type=classic`` and no other argument: a classic
    queue declared that way (the plugin's own classic queues, a plain one) takes it and
    nothing changes; any other (quorum, stream, or a classic one with arguments) answers
    406 on a throwaway channel and is not known to be classic.
    """
    channel = await connection.channel()
    try:
        await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "classic"})
    except AMQPError:
        return False
    finally:
        if not channel.is_closed:
            await channel.close()
    return True


def lock_name(queue: str) -> str:
    """Return the name of the lock queue of ``queue`` (at most 255 bytes, as AMQP allows)."""
    name = f"faststream-retry.lock.{queue}"
    if len(name.encode()) <= 255:
        return name
    return f"faststream-retry.lock.{hashlib.sha256(queue.encode()).hexdigest()}"


@asynccontextmanager
async def exclusive(connection: AbstractConnection, queue: str) -> AsyncIterator[None]:
    """Hold the lock of ``queue``: one command at a time goes through a queue.

    The lock is an exclusive queue, which RabbitMQ deletes when its connection goes,
    however the command ends. A user without the permission to declare it goes on
    without the lock.

    Raises:
        OperationError: another command holds the lock.
    """
    channel = await connection.channel()
    name = lock_name(queue)
    try:
        await channel.declare_queue(name, exclusive=True, auto_delete=True)
    except ChannelLockedResource:
        raise OperationError(
            f"another faststream-retry command is going through {queue!r} (a list, replay, "
            "purge, export or migrate); wait until it ends, then run this again"
        ) from None
    except ChannelAccessRefused:
        pass  # no permission to configure the lock: go on without it
    try:
        yield
    finally:
        if not channel.is_closed:
            # Gone with the connection anyway; a service's connection lives on.
            with contextlib.suppress(AMQPError):
                await channel.queue_delete(name)
            await channel.close()
