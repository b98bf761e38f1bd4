"""Read the registry ``<prefix>.queues`` (every work queue the plugin covered) without changing it.

AMQP cannot list queues; the plugin keeps one record per covered work queue in a durable
queue for that. Reading a record means taking it unacked and handing it back, which is
free on a classic queue and spends a delivery on a quorum one (RabbitMQ 4 drops a
message at its delivery limit). The plugin declares the registry classic, but a queue
of that name could be anything, so its type is checked before a record is taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiormq.exceptions import ChannelAccessRefused, ChannelPreconditionFailed

from faststream_retry.ops.common import depth
from faststream_retry.topology import registry_name

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

__all__ = ["Registry", "registered_queues"]

# A record is a queue name: AMQP caps those at 255 bytes; anything longer is garbage.
_MAX_NAME_BYTES = 255


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
            if record.body and len(record.body) <= _MAX_NAME_BYTES:
                found.add(record.body.decode("utf-8", "replace"))
        return Registry(name, tuple(sorted(found)))
    finally:
        if not channel.is_closed:
            # Closing without acks hands every record back (classic: no count spent).
            await channel.close()
