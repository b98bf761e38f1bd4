"""``migrate``: give a queue the plugin owns new arguments (quorum <-> classic) and lose nothing.

RabbitMQ cannot change a queue's arguments: the queue has to be deleted and declared
again. So its messages move to a temporary queue, the queue is replaced, and they move
back. Every move is confirm-then-ack: a message is got without auto-ack, its copy
published with every property and header kept, and the original acked only after the
broker confirmed the copy (a ``basic.return``, an unroutable copy, is a failure). A kill
at any point leaves each message in one queue or, for the last batch in flight, in
both: a duplicate, never a loss. Running the same command again finishes the job (see
``migration.steps``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from aiormq.exceptions import ChannelAccessRefused, ChannelPreconditionFailed
from pamqp import commands as spec

from faststream_retry.core.advice import Refusal
from faststream_retry.core.defaults import DELIVERY_LIMIT, PREFIX, QueueType
from faststream_retry.core.topology import migrating_name, retry_queue_name
from faststream_retry.core.versions import MIN_VERSION, parse_version
from faststream_retry.ops import migration
from faststream_retry.ops.common import OperationError, amqp_of, exclusive
from faststream_retry.ops.walk import TooLarge
from faststream_retry.rabbit import frames
from faststream_retry.rabbit.checks import declare_checked
from faststream_retry.rabbit.probe import depth
from faststream_retry.rabbit.registry import registered_queues

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from aio_pika.abc import AbstractConnection

    from faststream_retry.ops.migration import Owned

__all__ = ["MigrationResult", "migrate"]

BATCH = 200
"""Messages in flight at once: what a kill can duplicate, and, on a quorum queue, the
deliveries whose count a kill raises by one."""

_DELETE_ATTEMPTS = 5
_SETTLE_S = 3.0


@dataclass(frozen=True, slots=True)
class MigrationResult:
    """What a migration did."""

    queue: str
    role: str
    queue_type: str
    arguments: dict[str, Any]
    """The queue's arguments now."""
    temp_queue: str
    resumed: bool
    """The temporary queue existed at start: this run finished one that was cut short."""
    moved_out: int = 0
    moved_back: int = 0
    steps: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """Return the result as JSON-able data (what ``migrate --json`` prints)."""
        return {
            "queue": self.queue,
            "role": self.role,
            "queue_type": self.queue_type,
            "arguments": self.arguments,
            "temp_queue": self.temp_queue,
            "resumed": self.resumed,
            "moved_out": self.moved_out,
            "moved_back": self.moved_back,
            "steps": list(self.steps),
        }


async def migrate(
    connection: AbstractConnection,
    queue: str,
    *,
    queue_type: QueueType,
    prefix: str = PREFIX,
    delivery_limit: int = DELIVERY_LIMIT,
    progress: Callable[[str, int, int], None] | None = None,
) -> MigrationResult:
    """Move ``queue`` to the arguments ``queue_type`` plans for its role, losing no message.

    ``queue`` is a ``<queue>.retry``, a ``<queue>.dlq`` or a tier ``<prefix>.delay.<ms>``.
    ``delivery_limit`` is the ``RetryMiddleware``'s (a quorum ``.retry`` carries it).
    ``progress(step, done, total)`` is called after each batch of a move. Messages in a
    tier start their TTL again: they come out later than planned, never early. A kill
    hands back the batch in flight (at most ``BATCH``) by closing the channel: on a
    quorum queue that counts one delivery for each of those messages, as does a copy the
    broker refuses, which stops the move with nothing of its batch acked.

    Raises:
        OperationError: the name is not one the plugin owns; the queue (or its
            temporary queue) has a consumer (an app is running, and would declare it
            again with its old arguments); the broker is too old for ``queue_type``; the
            user lacks a permission; or a copy was not confirmed (nothing was acked
            after it: run again).
    """
    role = migration.owned(queue, prefix)
    if isinstance(role, str):
        raise OperationError(f"refusing to migrate {queue!r}: {role}")
    # One command at a time goes through a queue: a dlq replay meanwhile would miss
    # what sits in the temporary queue.
    async with exclusive(connection, queue):
        return await _migrate(
            connection,
            queue,
            role,
            queue_type=queue_type,
            prefix=prefix,
            delivery_limit=delivery_limit,
            progress=progress,
        )


async def _migrate(
    connection: AbstractConnection,
    queue: str,
    role: Owned,
    *,
    queue_type: QueueType,
    prefix: str,
    delivery_limit: int,
    progress: Callable[[str, int, int], None] | None,
) -> MigrationResult:
    amqp = amqp_of(connection)
    version = parse_version(amqp.server_properties.get("version"))
    if version is not None and version < MIN_VERSION[queue_type]:
        need = ".".join(map(str, MIN_VERSION[queue_type]))
        raise OperationError(f"queue_type={queue_type!r} needs RabbitMQ {need} or later")
    target = migration.target_spec(role, queue_type, prefix, delivery_limit)
    temp = migrating_name(queue)
    todo, resumed, classic = await _todo(connection, role, target.arguments, prefix)
    result = MigrationResult(
        queue, role.role, queue_type, dict(target.arguments), temp, resumed=resumed, steps=todo
    )
    if not todo:
        return result
    mover = _Mover(amqp, progress)
    moved_out = moved_back = 0
    quorum_temp = version is None or version >= MIN_VERSION["quorum"]
    if not resumed:
        await _declare(amqp, temp, migration.temp_arguments(quorum_temp))
    for step in todo:
        if step == "drain":
            moved_out += await mover.move(queue, temp, None, "out")
        elif step == "replace":
            moved_out += await _replace(amqp, mover, role, target.arguments, temp, classic=classic)
        elif step == "back":
            moved_back += await mover.move(temp, queue, role, "back")
        elif not await _delete_empty(amqp, temp, classic=not quorum_temp):
            raise OperationError(f"{temp!r} is not empty (someone published into it?): run again")
    return replace(result, moved_out=moved_out, moved_back=moved_back)


async def _todo(
    connection: AbstractConnection,
    role: Owned,
    arguments: Mapping[str, Any],
    prefix: str,
) -> tuple[tuple[migration.Step, ...], bool, bool]:
    """Return the steps left, whether the temporary queue exists, and whether the queue is classic.

    Raises:
        OperationError: the queue or its temporary queue has a consumer, or neither exists.
    """
    queue, temp = role.name, migrating_name(role.name)
    source, held = await depth(connection, queue), await depth(connection, temp)
    # Nothing consumes a tier or a .dlq: a running app shows in the consumers of its
    # work queues and their .retry queues. Their copies would meet a queue being
    # deleted (a classic one drops what it takes then) or declared again.
    watched = (
        [role.queue] if role.queue else list((await registered_queues(connection, prefix)).queues)
    )
    users = [await depth(connection, name) for q in watched for name in (q, retry_queue_name(q))]
    for found in (source, held, *users):
        if found is not None and found.consumers:
            raise OperationError(
                f"refusing to migrate {queue!r}: {found.name!r} has {found.consumers} "
                "consumer(s). An app that uses it is running, and would declare it again "
                f"with its old arguments: stop every service that uses prefix {prefix!r} "
                "(and this queue), then run migrate again"
            )
    amqp = amqp_of(connection)
    look: migration.Look = "missing"
    classic = False
    if source is not None:
        look = "target" if await _matches(amqp, queue, arguments) else "other"
        # Whether it may be deleted if-empty (quorum queues refuse the flag): known
        # for sure only when it is what queue_type="classic" declares.
        classic_spec = migration.target_spec(role, "classic", prefix, 0)
        classic = look == "other" and await _matches(amqp, queue, classic_spec.arguments)
    try:
        return migration.steps(look, held is not None), held is not None, classic
    except ValueError:
        raise OperationError(f"there is no queue {queue!r} (nor {temp!r}) to migrate") from None


async def _call(operation: Any, doing: str) -> Any:  # noqa: ANN401 - an aiormq RPC
    """Run an RPC; a refusal or a precondition failure becomes an ``OperationError``."""
    try:
        return await operation
    except (ChannelAccessRefused, ChannelPreconditionFailed) as exc:
        raise OperationError(f"could not {doing}: {exc.args[0] if exc.args else exc}") from exc


async def _matches(amqp: Any, queue: str, arguments: Any) -> bool:  # noqa: ANN401 - aiormq's
    """Return whether ``queue`` (which exists) has ``arguments``.

    Declaring it with them is a no-op when they are equal and a 406 when not, which
    closes only this throwaway channel.
    """
    found = await declare_checked(amqp, "queue", queue, dict(arguments))
    if isinstance(found, Refusal):
        raise OperationError(f"may not declare {queue!r}: {found.detail}")
    return found is None


async def _replace(
    amqp: Any,  # noqa: ANN401 - aiormq's connection
    mover: _Mover,
    role: Owned,
    arguments: Any,  # noqa: ANN401 - a mapping of queue arguments
    temp: str,
    *,
    classic: bool,
) -> int:
    """Delete the emptied queue and declare it with ``arguments``; return messages moved meanwhile.

    A tier may dead-letter a message into a ``.retry`` while it is emptied: what came
    is moved out too before the delete is tried again.
    """
    queue = role.name
    moved = 0
    for _ in range(_DELETE_ATTEMPTS):
        moved += await mover.move(queue, temp, None, "out")
        if await _delete_empty(amqp, queue, classic=classic):
            break
    else:
        raise OperationError(
            f"{queue!r} kept getting messages or a consumer while it was emptied: stop "
            "every service that uses it, then run migrate again"
        )
    await _declare(amqp, queue, arguments, tier=role.role == "tier")
    return moved


async def _delete_empty(amqp: Any, queue: str, *, classic: bool) -> bool:  # noqa: ANN401
    """Delete ``queue`` if it is empty and unused; return whether it was deleted.

    A classic queue is deleted ``if-empty`` and ``if-unused``, atomically. Quorum queues
    refuse those flags (RabbitMQ 3.10 closes the connection), so one is looked at
    first and deleted if it was empty: a message that arrives in between (a tier
    dead-lettering into a ``.retry`` at that instant) would go with it, and is reported.
    """
    channel = await amqp.channel()
    try:
        if classic:
            try:
                await channel.queue_delete(queue, if_unused=True, if_empty=True)
            except ChannelPreconditionFailed:
                return False
            return True
        if not await _settles(channel, queue):
            return False
        deleted = await channel.queue_delete(queue)
        if deleted.message_count:
            raise OperationError(
                f"{deleted.message_count} message(s) reached {queue!r} between the check that "
                "it was empty and its delete, and were deleted with it (quorum queues have no "
                "delete-if-empty): stop the services that publish to it before migrating"
            )
        return True
    finally:
        if not channel.is_closed:
            await channel.close()


async def _declare(
    amqp: Any,  # noqa: ANN401 - aiormq's connection
    queue: str,
    arguments: Mapping[str, Any],
    *,
    tier: bool = False,
) -> None:
    """Declare ``queue`` durable with ``arguments``; a tier also gets its exchange and binding.

    On a channel of its own, opened after the old queue was deleted: RabbitMQ 3.10's
    channel keeps what it knew of a queue by name, and publishing on it to a queue
    declared again with another type crashes the channel (and the connection).
    """
    channel = await amqp.channel()
    try:
        await _call(
            channel.queue_declare(queue, durable=True, arguments=dict(arguments)),
            f"declare {queue!r}",
        )
        if tier:
            await _call(
                channel.exchange_declare(queue, exchange_type="fanout", durable=True),
                f"declare exchange {queue!r}",
            )
            await _call(channel.queue_bind(queue, queue, routing_key=""), f"bind {queue!r}")
    finally:
        if not channel.is_closed:
            await channel.close()


async def _settles(channel: Any, queue: str) -> bool:  # noqa: ANN401 - aiormq's channel
    """Return whether ``queue`` is empty and unused, waiting a moment for acks to land.

    A quorum queue applies acks asynchronously: just after the last one its count may
    still include messages already settled.
    """
    deadline = asyncio.get_running_loop().time() + _SETTLE_S
    while True:
        declared = await channel.queue_declare(queue, passive=True)
        if not declared.message_count and not declared.consumer_count:
            return True
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.05)


def _check_fit(
    channel: Any,  # noqa: ANN401 - aiormq's channel
    source: str,
    batch: list[Any],
    copies: list[tuple[str, str, Any]],
) -> None:
    """Refuse a batch with a copy no frame can carry, before any of it is published.

    Such a publish would close the connection; the batch goes back unacked instead.
    """
    limit = frames.frame_limit(channel)
    if limit is None:
        return
    for message, (_, _, properties) in zip(batch, copies, strict=True):
        if not frames.fits(properties, len(message.body), limit):
            size = frames.header_size(properties, len(message.body))
            too_large = TooLarge(0, properties.message_id, size, limit)
            raise OperationError(
                f"message {properties.message_id!r} in {source!r} cannot be moved: "
                f"{too_large.why}. Nothing of its batch was acked. Take it out first "
                f"(faststream-retry dlq export, then purge --id), then run migrate again"
            )


class _Mover:
    """Moves every message from a queue to another, confirm-then-ack."""

    def __init__(
        self,
        amqp: Any,  # noqa: ANN401 - aiormq's connection
        progress: Callable[[str, int, int], None] | None,
    ) -> None:
        self._amqp = amqp
        self._user = amqp.url.user
        self._progress = progress

    async def move(self, source: str, destination: str, back_to: Owned | None, step: str) -> int:
        """Move every message of ``source`` to ``destination``; return how many.

        ``back_to`` is the queue when moving back (its routing key is restored then, and
        a tier's copies go through its exchange); ``None`` when moving out.
        """
        # A channel per move: see _declare.
        channel = await self._amqp.channel(publisher_confirms=True, on_return_raises=False)
        try:
            return await self._move(channel, source, destination, back_to, step)
        finally:
            if not channel.is_closed:
                await channel.close()

    async def _move(
        self,
        channel: Any,  # noqa: ANN401 - aiormq's channel, with confirms
        source: str,
        destination: str,
        back_to: Owned | None,
        step: str,
    ) -> int:
        declared = await channel.queue_declare(source, passive=True)
        total = declared.message_count or 0
        moved = 0
        while True:
            batch: list[Any] = []
            while len(batch) < BATCH:
                got = await channel.basic_get(source, no_ack=False)
                if isinstance(got.delivery, spec.Basic.GetEmpty):
                    break
                batch.append(got)
            if not batch:
                return moved
            copies = [self._copy(message, destination, back_to) for message in batch]
            _check_fit(channel, source, batch, copies)
            confirms = await asyncio.gather(
                *(
                    channel.basic_publish(
                        message.body,
                        exchange=exchange,
                        routing_key=routing_key,
                        properties=properties,
                        mandatory=True,
                    )
                    for message, (exchange, routing_key, properties) in zip(
                        batch, copies, strict=True
                    )
                )
            )
            refused = [c for c in confirms if not isinstance(c, spec.Basic.Ack)]
            if refused:
                # Nothing of this batch is acked: every original stays where it is.
                raise OperationError(
                    f"the broker did not take {len(refused)} copy(ies) into {destination!r} "
                    f"({type(refused[0]).__name__}); nothing after the last confirmed copy "
                    "was acked. Run migrate again"
                )
            # Every copy up to here is confirmed: one ack settles the whole batch.
            await channel.basic_ack(batch[-1].delivery.delivery_tag, multiple=True)
            moved += len(batch)
            if self._progress is not None:
                self._progress(step, moved, max(total, moved))

    def _copy(
        self,
        message: Any,  # noqa: ANN401 - aiormq's DeliveredMessage
        destination: str,
        back_to: Owned | None,
    ) -> tuple[str, str, Any]:
        """Return the exchange, routing key and properties of ``message``'s copy."""
        source = message.header.properties
        properties = spec.Basic.Properties(
            **{name: getattr(source, name) for name in source.__slots__}
        )
        if properties.user_id is not None and properties.user_id != self._user:
            # RabbitMQ refuses a publish whose user_id is not the connection's user.
            properties.user_id = None
        if back_to is None:
            properties.headers = migration.copy_headers(source.headers, message.routing_key or "")
            return "", destination, properties
        headers, routing_key = migration.restored_headers(source.headers)
        properties.headers = headers or None
        if back_to.role != "tier":
            return "", destination, properties
        if routing_key is None:
            raise OperationError(
                f"a message in the temporary queue (message_id {source.message_id!r}) has no "
                f"{migration.ROUTING_KEY_HEADER!r} header: it did not come from tier "
                f"{back_to.name!r}. Move it by hand"
            )
        # A tier dead-letters by the message's own routing key: it goes in by its exchange
        # with the key it had, so it comes out where it was going.
        return back_to.name, routing_key, properties
