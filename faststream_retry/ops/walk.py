"""One pass over a queue, message by message, with confirm-then-ack: the engine of the dlq commands.

A pass visits the messages that were in the queue when it began, head first, and
does one of three things with each: keep it, move it (publish a copy elsewhere,
wait for the broker's confirm, then ack), or drop it (ack). Nothing is acked before
its copy is confirmed, so a crash or a SIGKILL mid-way leaves at most a duplicate.

Kept messages must stay where they are without spending anything:

* In a classic queue a kept message stays unacked until the pass ends, then goes back
  with one ``nack(requeue)``: RabbitMQ puts requeued messages back in their old place
  and counts nothing.
* A quorum queue counts every requeue (a nack, a closed channel) against the
  message's delivery limit, and at the limit drops it or dead-letters it away. So a
  kept message is republished to the tail of its own queue, confirmed, then acked; a
  pass goes through every message, so the kept ones end up in their old order (new
  arrivals during the pass land ahead of them). A quorum queue is known by the
  ``x-delivery-count`` header RabbitMQ adds to each of its deliveries.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiormq.exceptions import AMQPError, ChannelNotFoundEntity, DeliveryError
from pamqp import commands

from faststream_retry.amqp.publisher import encodable_headers
from faststream_retry.ops.common import OperationError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from aio_pika.abc import AbstractConnection
    from aiormq.abc import AbstractChannel as UnderlayChannel

__all__ = ["DROP", "KEEP", "Move", "Pass", "Seen", "publish", "walk"]

DELIVERY_COUNT = "x-delivery-count"


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


KEEP = _Keep()
"""Leave the message where it is, in its place."""
DROP = _Drop()
"""Ack the message: it is gone (``dlq purge``)."""


@dataclass(frozen=True, slots=True)
class Move:
    """Publish this instead of the message, then ack the message."""

    exchange: str
    routing_key: str
    body: bytes
    properties: commands.Basic.Properties


Step = _Keep | _Drop | Move


@dataclass(frozen=True, slots=True)
class Seen:
    """A message as the pass fetched it."""

    position: int
    """1 for the head of the queue when the pass began."""
    body: bytes
    properties: commands.Basic.Properties


@dataclass(slots=True)
class Pass:
    """What a pass did."""

    queue: str
    total: int
    """Messages in the queue when the pass began."""
    visited: int = 0
    kept: int = 0
    moved: int = 0
    dropped: int = 0
    quorum: bool = False


def _own(properties: commands.Basic.Properties, user: str | None) -> commands.Basic.Properties:
    """Return ``properties`` as this connection may publish them.

    The broker's delivery count goes (a copy is a new message to the queue), and so
    does a ``user_id`` other than the connection's (RabbitMQ refuses such a publish).
    """
    headers = dict(properties.headers or {})
    headers.pop(DELIVERY_COUNT, None)
    return commands.Basic.Properties(
        content_type=properties.content_type,
        content_encoding=properties.content_encoding,
        headers=encodable_headers(headers),
        delivery_mode=properties.delivery_mode,
        priority=properties.priority,
        correlation_id=properties.correlation_id,
        reply_to=properties.reply_to,
        expiration=properties.expiration,
        message_id=properties.message_id,
        timestamp=properties.timestamp,
        message_type=properties.message_type,
        user_id=properties.user_id if properties.user_id == user else None,
        app_id=properties.app_id,
        cluster_id=properties.cluster_id,
    )


async def publish(
    channel: UnderlayChannel,
    move: Move,
    user: str | None,
) -> None:
    """Publish ``move`` with ``mandatory`` and wait for the confirm.

    Raises:
        OperationError: the broker returned the message (no queue to take it) or
            refused it (a nack: a queue at its length limit), or the channel broke.
    """
    where = f"queue {move.routing_key!r}" if not move.exchange else f"exchange {move.exchange!r}"
    try:
        result = await channel.basic_publish(
            move.body,
            exchange=move.exchange,
            routing_key=move.routing_key,
            properties=_own(move.properties, user),
            mandatory=True,
        )
    except DeliveryError as exc:
        raise OperationError(f"{where} refused the message (is it full?): {exc!r}") from exc
    except ChannelNotFoundEntity as exc:
        raise OperationError(f"{where} does not exist") from exc
    except (AMQPError, ConnectionError) as exc:
        raise OperationError(f"publishing to {where} failed: {exc!r}") from exc
    if not isinstance(result, commands.Basic.Ack):
        reply = getattr(getattr(result, "delivery", None), "reply_text", type(result).__name__)
        raise OperationError(f"{where} did not take the message ({reply}): does it exist?")


class _Rate:
    """At most ``per_s`` moves a second, evenly spaced."""

    def __init__(self, per_s: float | None) -> None:
        self._gap = 1 / per_s if per_s else 0.0
        self._next = time.monotonic()

    async def wait(self) -> None:
        if not self._gap:
            return
        now = time.monotonic()
        if self._next > now:
            await asyncio.sleep(self._next - now)
        self._next = max(self._next, now) + self._gap


class _Walker:
    """One pass's channel and state."""

    def __init__(
        self,
        underlay: UnderlayChannel,
        done: Pass,
        *,
        user: str | None,
        visit: Callable[[Seen], Awaitable[Step]],
        enough: Callable[[], bool],
        rate: float | None,
    ) -> None:
        self.underlay = underlay
        self.done = done
        self.user = user
        self.visit = visit
        self.enough = enough
        self.pace = _Rate(rate)
        self.held: int | None = None
        """The last delivery tag kept unacked (classic queues)."""
        self.failure: OperationError | None = None
        """The move that failed; the rest of the pass keeps every message."""

    async def next(self) -> bool:
        """Fetch and handle the next message; return whether the pass goes on."""
        done = self.done
        got = await self.underlay.basic_get(done.queue, no_ack=False)
        if not isinstance(got.delivery, commands.Basic.GetOk):
            return False  # someone else consumed the rest
        tag = got.delivery.delivery_tag or 0  # always set on a GetOk
        if done.visited == 0:
            done.quorum = DELIVERY_COUNT in (got.header.properties.headers or {})
        done.visited += 1
        seen = Seen(done.visited, got.body, got.header.properties)
        step: Step = KEEP if self.failure or self.enough() else await self.visit(seen)
        if isinstance(step, Move):
            await self.pace.wait()
            await self.move(seen, tag, step)
        elif step is DROP:
            await self.underlay.basic_ack(tag)
            done.dropped += 1
        else:
            await self.keep(seen, tag)
        # A quorum queue's pass goes through every message, so the kept ones end in
        # their old order; a classic one can end early, its kept messages unmoved.
        return done.quorum or not (self.failure or self.enough())

    async def keep(self, seen: Seen, tag: int) -> None:
        self.done.kept += 1
        if not self.done.quorum:
            self.held = tag
            return
        await publish(
            self.underlay, Move("", self.done.queue, seen.body, seen.properties), self.user
        )
        await self.underlay.basic_ack(tag)

    async def move(self, seen: Seen, tag: int, move: Move) -> None:
        try:
            await publish(self.underlay, move, self.user)
        except OperationError as exc:
            # The message stays: held (classic), or back at the tail (quorum); if
            # even that fails, the channel closes with it unacked, a counted requeue.
            self.failure = exc
            await self.keep(seen, tag)
            return
        await self.underlay.basic_ack(tag)
        self.done.moved += 1

    async def release(self) -> None:
        if self.held is not None and not self.underlay.is_closed:
            # Back in their old places, uncounted (only classic queues hold).
            await self.underlay.basic_nack(self.held, multiple=True, requeue=True)


async def walk(
    connection: AbstractConnection,
    queue: str,
    visit: Callable[[Seen], Awaitable[Step]],
    *,
    enough: Callable[[], bool] = lambda: False,
    rate: float | None = None,
    progress: Callable[[Pass], None] | None = None,
) -> Pass:
    """Visit every message ``queue`` holds now, head first, doing what ``visit`` returns.

    Once ``enough()`` holds, the rest are kept without a visit (a classic queue's
    pass ends there). ``rate`` spaces the moves out; ``progress`` is called after
    each message.

    Raises:
        OperationError: the queue does not exist, or a move failed: the message it
            was moving is kept, and so is every one after it.
    """
    channel = await connection.channel(publisher_confirms=True)
    try:
        underlay = await channel.get_underlay_channel()
        try:
            declared = await underlay.queue_declare(queue, passive=True)
        except ChannelNotFoundEntity:
            raise OperationError(f"queue {queue!r} does not exist") from None
        done = Pass(queue, declared.message_count or 0)
        user = getattr(getattr(connection, "url", None), "user", None)
        walker = _Walker(underlay, done, user=user, visit=visit, enough=enough, rate=rate)
        try:
            going = True
            while going and done.visited < done.total:
                going = await walker.next()
                if progress is not None:
                    progress(done)
        finally:
            await walker.release()
        if walker.failure is not None:
            raise walker.failure
        return done
    finally:
        if not channel.is_closed:
            await channel.close()


def properties_dict(properties: commands.Basic.Properties) -> dict[str, Any]:
    """Return the properties that are set, by their AMQP names."""
    return {
        name: value
        for name in _PROPERTY_NAMES
        if (value := getattr(properties, name, None)) is not None and name != "headers"
    }


_PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "message_type",
    "user_id",
    "app_id",
    "cluster_id",
)
