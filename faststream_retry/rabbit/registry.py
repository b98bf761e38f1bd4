"""The registry of covered work queues, and the messages nobody would release.

A message waits in a tier and then in ``<queue>.retry`` until a re-check consumer
releases it. When an app restarts with that handler's retries off, or with the
subscriber renamed or removed, nobody consumes ``<queue>.retry`` any more and its
messages wait for ever, in silence.

Two things at start prevent that. ``retry_queues_in_use`` finds the subscriber queues
with retries off whose ``.retry`` still exists: the plugin keeps releasing those. And
the registry, a durable queue ``<prefix>.queues`` holding one message per work queue
the plugin ever covered (AMQP cannot list queues), lets ``survey`` name the ``.retry``
queues with messages and no consumer that no subscriber of this app owns.

``registered_queues`` and ``stranded_queues`` read the registry for the operator commands and
the worker, changing nothing. Reading a record means taking it unacked and handing it back, which
is free on a classic queue and spends a delivery on a quorum one (RabbitMQ 4 drops a
message at its delivery limit). The plugin declares the registry classic, but a queue
of that name could be anything, so its type is checked before a record is taken.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aio_pika
from aiormq.exceptions import ChannelAccessRefused, ChannelPreconditionFailed

from faststream_retry.core.topology import MAX_NAME_BYTES, registry_name, retry_queue_name
from faststream_retry.rabbit.channels import RPC_TIMEOUT_S, close_quietly
from faststream_retry.rabbit.probe import QueueDepth, depth, depths
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Iterable

    from aio_pika.abc import (
        AbstractChannel,
        AbstractConnection,
        AbstractIncomingMessage,
        AbstractQueue,
        AbstractRobustConnection,
    )

    from faststream_retry.core.topology import Plan

__all__ = [
    "Registry",
    "Stranded",
    "record",
    "registered_queues",
    "retry_queues_in_use",
    "stranded_queues",
    "survey",
]


@dataclass(frozen=True, slots=True)
class Stranded:
    """A ``.retry`` queue holding messages that no consumer releases."""

    queue: str
    messages: int


def _stranded(waiting: QueueDepth) -> Stranded | None:
    """Return ``waiting`` (a ``.retry``) as stranded: it holds messages and nothing consumes it."""
    if waiting.messages and not waiting.consumers:
        return Stranded(waiting.name, waiting.messages)
    return None


async def retry_queues_in_use(connection: AbstractConnection, queues: Iterable[str]) -> list[str]:
    """Return those of ``queues`` whose ``.retry`` exists (retries off now, maybe on before)."""
    names = list(queues)
    looks = await depths(connection, [retry_queue_name(queue) for queue in names])
    return [queue for queue, found in zip(names, looks, strict=True) if found is not None]


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
        others: list[tuple[AbstractIncomingMessage, str]] = []
        # Every record taken without an ack: closing the channel puts them back.
        for record in await _take_all(registry):
            queue = record.body.decode("utf-8", "replace")
            if queue in known or not queue or len(record.body) > MAX_NAME_BYTES:
                await record.ack()  # a duplicate (two apps started at once) or garbage
                continue
            known.add(queue)
            if queue not in owned:
                others.append((record, queue))
        looks = await depths(connection, [retry_queue_name(queue) for _, queue in others])
        for (record, _), waiting in zip(others, looks, strict=True):
            if waiting is None:
                await record.ack()  # its .retry is gone: nothing to watch any more
            elif found := _stranded(waiting):
                stranded.append(found)
        # Confirmed together: one round trip for them all, not one each.
        await asyncio.gather(
            *(_publish_record(channel, name, queue) for queue in sorted(set(plan.routes) - known))
        )
    finally:
        await close_quietly(channel)
    return stranded


_IDLE_S = 0.05
"""How long ``_take_all`` waits for one more record before it takes the registry as read."""


async def _take_all(registry: AbstractQueue) -> list[AbstractIncomingMessage]:
    """Take every record of ``registry``, unacked, with one consumer.

    One ``basic.get`` per record cost a round trip each (300 records: a quarter of a
    second). The count is the declaration's; records another app holds unacked at that
    moment (it starts too) never come, so the read also ends once none came for
    ``_IDLE_S``.
    """
    expected = registry.declaration_result.message_count or 0
    records: list[AbstractIncomingMessage] = []
    if not expected:
        return records
    complete = asyncio.Event()

    async def take(record: AbstractIncomingMessage) -> None:
        records.append(record)
        if len(records) >= expected:
            complete.set()

    tag = await registry.consume(take, no_ack=False, timeout=RPC_TIMEOUT_S)
    try:
        while not complete.is_set():
            seen = len(records)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(complete.wait(), _IDLE_S)
            if len(records) == seen:
                break
    finally:
        await registry.cancel(tag, timeout=RPC_TIMEOUT_S)
    return list(records)


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


async def stranded_queues(
    connection: AbstractConnection, prefix: str, owned: Iterable[str]
) -> list[Stranded]:
    """Return the stranded ``.retry`` queues of the registry's queues not in ``owned``.

    What ``survey`` finds, changing nothing: no record is added or dropped. A registry
    that is not read (see ``registered_queues``) finds none.
    """
    owned = set(owned)
    found: list[Stranded] = []
    for queue in (await registered_queues(connection, prefix)).queues:
        if queue in owned:
            continue
        waiting = await depth(connection, retry_queue_name(queue))
        if waiting is not None and (one := _stranded(waiting)):
            found.append(one)
    return found


@dataclass(frozen=True, slots=True)
class Registry:
    """The work queues the registry names, sorted; ``note`` says why there are none."""

    name: str
    queues: tuple[str, ...]
    note: str | None = None


async def registered_queues(connection: AbstractConnection, prefix: str) -> Registry:
    """Return the work queues recorded in ``<prefix>.queues``, leaving every record in place.

    Records are taken unacked and handed back when the channel closes, so nothing is
    consumed. A registry that is not a classic queue is not read (that would spend
    its records' delivery count): the result is empty with a note saying so.
    """
    name = registry_name(prefix)
    if await depth(connection, name) is None:
        return Registry(
            name, (), f"no registry queue {name}: no app with prefix {prefix!r} has started here"
        )
    channel = await connection.channel()
    try:
        try:
            # Equivalent to the plugin's own declaration, so it creates nothing and
            # changes nothing; a quorum or stream queue answers 406 instead.
            registry = await channel.declare_queue(
                name, durable=True, arguments={"x-queue-type": "classic"}
            )
        except ChannelPreconditionFailed:
            return Registry(
                name,
                (),
                f"{name} is not a classic queue: reading it would spend its records' delivery "
                "count, so it was not read; name the queues or give --app",
            )
        except ChannelAccessRefused:
            return Registry(
                name,
                (),
                f"{name} was not read: reading it without spending anything needs the "
                "configure permission on it; name the queues or give --app",
            )
        found: set[str] = set()
        # Every record stays unacked until the channel closes: a get cannot return one
        # record twice, so the loop ends when all were seen. An app that starts meanwhile
        # sees fewer records and adds duplicates, which its next start drops.
        while (record := await registry.get(no_ack=False, fail=False)) is not None:
            if record.body and len(record.body) <= MAX_NAME_BYTES:
                found.add(record.body.decode("utf-8", "replace"))
        return Registry(name, tuple(sorted(found)))
    finally:
        if not channel.is_closed:
            # Closing without acks hands every record back (classic: no count spent).
            await channel.close()
