"""What every operation shares: the connection, the error type, the lock of a queue."""

from __future__ import annotations

import contextlib
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import aio_pika
from aiormq.exceptions import AMQPError, ChannelAccessRefused, ChannelLockedResource

from faststream_retry.amqp.connection import connect_failure, safe_url
from faststream_retry.core.topology import lock_name
from faststream_retry.errors import FastStreamRetryError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from aio_pika.abc import AbstractConnection

__all__ = ["DEFAULT_URL", "OperationError", "amqp_of", "connect", "exclusive"]

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"
CONNECT_TIMEOUT_S = 10.0


class OperationError(FastStreamRetryError):
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


def amqp_of(connection: AbstractConnection) -> Any:  # noqa: ANN401 - aiormq's connection
    """Return the aiormq connection under ``connection``.

    Raises:
        OperationError: the connection is closed.
    """
    transport = connection.transport
    if transport is None:
        raise OperationError("the broker connection is closed")
    return transport.connection


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
