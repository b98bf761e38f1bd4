"""Waiting messages nobody would release: the queues of switched-off and vanished handlers.

A message waits in a tier and then in ``<queue>.retry`` until a re-check consumer
releases it. When an app restarts with that handler's retries off, or with the
subscriber renamed or removed, nobody consumes ``<queue>.retry`` any more and its
messages wait for ever, in silence.

Two things at start prevent that. ``retry_queues_in_use`` finds the subscriber queues
with retries off whose ``.retry`` still exists: the plugin keeps releasing those. And
the registry, a durable queue ``<prefix>.queues`` holding one message per work queue
the plugin ever covered (AMQP cannot list queues), lets ``survey`` name the ``.retry``
queues with messages and no consumer that no subscriber of this app owns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import aio_pika
from aiormq.exceptions import ChannelNotFoundEntity

from faststream_retry._log import log
from faststream_retry.amqp.channels import RPC_TIMEOUT_S, close_quietly
from faststream_retry.topology import registry_name, retry_queue_name

if TYPE_CHECKING:
    from collections.abc import Iterable

    from aio_pika.abc import AbstractChannel, AbstractRobustConnection

    from faststream_retry.topology import Plan

__all__ = ["Stranded", "record", "retry_queues_in_use", "survey"]

# A registry record is a queue name: AMQP caps those at 255 bytes.
_MAX_NAME_BYTES = 255


@dataclass(frozen=True, slots=True)
class Stranded:
    """A ``.retry`` queue holding messages that no consumer releases."""

    queue: str
    messages: int


async def _depth(connection: AbstractRobustConnection, queue: str) -> tuple[int, int] | None:
    """Return ``(messages, consumers)`` of ``queue``, or ``None`` if it does not exist."""
    # A channel per look: a missing queue closes the channel it was asked on.
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True, timeout=RPC_TIMEOUT_S)
    except ChannelNotFoundEntity:
        return None
    finally:
        await close_quietly(channel)
    result = declared.declaration_result
    return result.message_count or 0, result.consumer_count or 0


async def retry_queues_in_use(
    connection: AbstractRobustConnection, queues: Iterable[str]
) -> list[str]:
    """Return those of ``queues`` whose ``.retry`` exists (retries off now, maybe on before)."""
    return [
        queue for queue in queues if await _depth(connection, retry_queue_name(queue)) is not None
    ]


async def survey(
    connection: AbstractRobustConnection, plan: Plan, owned: Iterable[str]
) -> list[Stranded]:
    """Record the queues ``plan`` covers; return the stranded ``.retry`` queues of others.

    ``owned`` are the work queues of this app's subscribers, covered or not. A queue
    in the registry that this app does not own and whose ``.retry`` holds messages
    with no consumer is stranded. A registry record whose ``.retry`` is gone is
    dropped.
    """
    name = registry_name(plan.options.prefix)
    owned = set(owned)
    stranded: list[Stranded] = []
    channel = await connection.channel(publisher_confirms=True)
    try:
        registry = await channel.declare_queue(
            name,
            durable=True,
            # Classic whatever queue_type says: every start reads the records and hands
            # them back by closing the channel, and on a quorum queue each hand-back is a
            # delivery; RabbitMQ 4's default delivery limit (20) would drop them. A lost
            # record costs only this warning.
            arguments={"x-queue-type": "classic"},
            timeout=RPC_TIMEOUT_S,
        )
        known: set[str] = set()
        # Read every record without acking: closing the channel puts them back.
        while (
            record := await registry.get(no_ack=False, fail=False, timeout=RPC_TIMEOUT_S)
        ) is not None:
            queue = record.body.decode("utf-8", "replace")
            if queue in known or not queue or len(record.body) > _MAX_NAME_BYTES:
                await record.ack()  # a duplicate (two apps started at once) or garbage
                continue
            known.add(queue)
            if queue in owned:
                continue
            depth = await _depth(connection, retry_queue_name(queue))
            if depth is None:
                await record.ack()  # its .retry is gone: nothing to watch any more
            elif depth[0] and not depth[1]:
                stranded.append(Stranded(retry_queue_name(queue), depth[0]))
        for queue in sorted(set(plan.routes) - known):
            await _publish_record(channel, name, queue)
    finally:
        await close_quietly(channel)
    return stranded


async def record(connection: AbstractRobustConnection, plan: Plan, queue: str) -> None:
    """Add ``queue`` to the registry (a subscriber that joined late); duplicates go at start."""
    channel = await connection.channel(publisher_confirms=True)
    try:
        await _publish_record(channel, registry_name(plan.options.prefix), queue)
    except Exception as exc:  # a diagnosis must not stop the subscriber
        log.warning("faststream-retry: could not record %r in the registry: %r", queue, exc)
    finally:
        await close_quietly(channel)


async def _publish_record(channel: AbstractChannel, registry: str, queue: str) -> None:
    await channel.default_exchange.publish(
        aio_pika.Message(queue.encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
        routing_key=registry,
        timeout=RPC_TIMEOUT_S,
    )
