"""What a look at a queue tells, without changing it: its depth, and whether it is classic."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import TYPE_CHECKING

import aio_pika
from aiormq.exceptions import AMQPError, ChannelNotFoundEntity

from faststream_retry.rabbit.channels import RPC_TIMEOUT_S, close_quietly

if TYPE_CHECKING:
    from collections.abc import Iterable

    from aio_pika.abc import AbstractChannel, AbstractConnection

__all__ = [
    "LOOKS",
    "Probe",
    "QueueDepth",
    "depth",
    "depths",
    "plain_classic",
    "refuses_transient_queues",
]


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
        declared = await channel.declare_queue(queue, passive=True, timeout=RPC_TIMEOUT_S)
    except ChannelNotFoundEntity:
        return None
    finally:
        await close_quietly(channel)
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
        await channel.declare_queue(
            queue, durable=True, arguments={"x-queue-type": "classic"}, timeout=RPC_TIMEOUT_S
        )
    except AMQPError:
        return False
    finally:
        await close_quietly(channel)
    return True


_DEPRECATED = "transient_nonexcl_queues"


async def refuses_transient_queues(url: str) -> bool | None:
    """Return whether the broker at ``url`` refuses a transient queue that is not exclusive.

    RabbitMQ 4.x deprecates such queues, and refuses them where an operator set
    ``deprecated_features.permit.transient_nonexcl_queues = false``: it then closes the
    whole connection (541), so the probe runs on a connection of its own. The probe
    queue, ``faststream-retry.probe.<random>``, expires a second after it is made.
    ``None``: the probe itself failed (no connection, no permission), so nothing is known.
    """
    name = f"faststream-retry.probe.{secrets.token_hex(8)}"
    try:
        connection = await aio_pika.connect(url, timeout=RPC_TIMEOUT_S)
    except Exception:
        return None
    try:
        channel = await connection.channel()
        await channel.declare_queue(
            name, durable=False, exclusive=False, arguments={"x-expires": 1000}
        )
    except AMQPError as exc:
        return _DEPRECATED in str(exc) or None
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
    return False


LOOKS = 8
"""Passive declares in flight at once in ``depths``, each on a probe of its own."""


async def depths(connection: AbstractConnection, queues: Iterable[str]) -> list[QueueDepth | None]:
    """Return ``depth`` of each of ``queues``, in order, looked at ``LOOKS`` at a time.

    One round trip per queue on a few channels, rather than a channel opened and closed
    for each: a start looks at every ``.retry`` of a registry that may name hundreds.
    """
    names = list(queues)
    found: dict[int, QueueDepth | None] = {}
    todo = iter(enumerate(names))

    async def look() -> None:
        probe = Probe(connection)
        try:
            for index, name in todo:
                found[index] = await probe.depth(name)
        finally:
            await probe.close()

    await asyncio.gather(*(look() for _ in range(min(LOOKS, len(names)))))
    return [found[index] for index in range(len(names))]


class Probe:
    """Passive declares on one channel, kept between looks (a sampler looks every scrape).

    The declares go through the channel's aiormq underlay: a robust channel would keep
    each queue it declared, to declare it again after a reconnect. A missing queue
    closes the channel; the next look opens another.
    """

    def __init__(self, connection: AbstractConnection) -> None:
        """Look at queues on ``connection``."""
        self._connection = connection
        self._channel: AbstractChannel | None = None

    async def depth(self, queue: str) -> QueueDepth | None:
        """Return the ready messages and consumers of ``queue``; ``None`` if it does not exist."""
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel()
        underlay = await self._channel.get_underlay_channel()
        try:
            result = await asyncio.wait_for(
                underlay.queue_declare(queue, passive=True), RPC_TIMEOUT_S
            )
        except ChannelNotFoundEntity:
            await self.close()
            return None
        return QueueDepth(queue, result.message_count or 0, result.consumer_count or 0)

    async def close(self) -> None:
        """Close the channel, if one is open."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await close_quietly(channel)
