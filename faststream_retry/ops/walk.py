"""One pass over a queue, message by message, with confirm-then-ack: the engine of the dlq commands.

A pass visits the messages that were in the queue when it began, head first, and
does one of three things with each: keep it, move it (publish a copy elsewhere,
wait for the broker's confirm, then ack), or drop it (ack). Nothing is acked before
its copy is confirmed, so a crash or a SIGKILL mid-way leaves at most a duplicate.

Kept messages must stay where they are without spending anything:

* A classic queue counts nothing: a kept message stays unacked until the pass ends,
  then goes back with one ``nack(requeue)``, and RabbitMQ puts it back in its old place.
* A quorum queue counts every requeue (a nack, a closed channel) against the
  message's delivery limit, and at the limit drops it or dead-letters it away. So a
  kept message is republished to the tail of its own queue, confirmed, then acked; a
  pass goes through every message, so the kept ones end up in their old order (what
  arrives during the pass lands among them, ahead of those not yet passed).

Only a queue known to be classic is passed the first way: one that takes a declaration
with ``x-queue-type=classic`` and nothing else (the plugin's own classic queues do;
declaring an existing queue the same way changes nothing). Every other queue, quorum or
not known, is passed the second way, which is safe for any type. (The
``x-delivery-count`` header cannot tell: RabbitMQ 3.12 and later leave it off a first
delivery.)

A message whose headers do not fit in a frame cannot be published at all (RabbitMQ's
own ``x-death`` can take a dead letter past ``frame_max``, and such a publish would close
the connection): the pass never tries. It holds the message unacked until the end and
then gives it back with one requeue, in its place on a classic queue, at the head on a
quorum one (which counts that as a delivery), and reports it (``Pass.too_large``); a
move of it is not made. Every other message is passed as usual.

Two passes over one queue at once would see each other's kept messages as new ones:
each pass holds an exclusive lock queue for its queue, and a second one is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiormq.exceptions import (
    AMQPError,
    ChannelInvalidStateError,
    ChannelNotFoundEntity,
    DeliveryError,
)
from pamqp import commands

from faststream_retry.core import headers as h
from faststream_retry.ops.common import OperationError, check_name, exclusive
from faststream_retry.ops.pace import Rate
from faststream_retry.rabbit import frames
from faststream_retry.rabbit.probe import depth, plain_classic
from faststream_retry.rabbit.publisher import encodable_headers

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from aio_pika.abc import AbstractConnection
    from aiormq.abc import AbstractChannel as UnderlayChannel
    from aiormq.abc import DeliveredMessage

__all__ = [
    "DROP",
    "KEEP",
    "Move",
    "Pass",
    "PassStoppedError",
    "Seen",
    "TooLarge",
    "TooLargeError",
    "oversize",
    "publish",
    "stop_all",
    "walk",
]


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


@dataclass(frozen=True, slots=True)
class TooLarge:
    """A message no publish can carry: its properties take more than a frame holds."""

    position: int
    """Its place in the queue when the pass began (1: the head), or its line in a file."""
    message_id: str | None
    size: int
    """The bytes its header frame would take."""
    limit: int
    """The bytes a frame holds on this connection (``frame_max`` less 8)."""

    def to_json(self) -> dict[str, Any]:
        """Return it as the ``too_large`` entries of a ``--json`` answer have it."""
        return {
            "position": self.position,
            "message_id": self.message_id,
            "size": self.size,
            "limit": self.limit,
        }

    @property
    def why(self) -> str:
        """Say why it cannot be published, in one line."""
        return (
            f"its headers take {self.size:,} bytes and a frame holds {self.limit:,} "
            "(frame_max less 8): RabbitMQ would close the connection on such a publish"
        )


class TooLargeError(OperationError):
    """A publish was not made: the message's headers do not fit in a frame."""

    def __init__(self, where: str, too_large: TooLarge) -> None:
        """Name the message and the destination."""
        super().__init__(
            f"message {too_large.message_id!r} was not published to {where}: {too_large.why}"
        )
        self.too_large = too_large


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
    in_place: bool = False
    """Kept messages stayed unacked in their places (a classic queue); otherwise each
    was republished to the tail, and the pass went through the whole queue."""
    consumers: int = 0
    """Consumers of the queue when the pass began: what they hold unacked it cannot see."""
    too_large: list[TooLarge] = field(default_factory=list)
    """Messages it could neither move nor republish in place: given back with a requeue."""


def _own(properties: commands.Basic.Properties, user: str | None) -> commands.Basic.Properties:
    """Return ``properties`` as this connection may publish them.

    The broker's delivery counts go (a copy is a new message to the queue), and so
    does a ``user_id`` other than the connection's (RabbitMQ refuses such a publish).
    """
    headers = h.without_broker_counts(properties.headers)
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


def oversize(
    channel: UnderlayChannel, move: Move, user: str | None, position: int = 0
) -> TooLarge | None:
    """Return why ``move`` cannot be published on ``channel`` (``position`` names it), if so."""
    limit = frames.frame_limit(channel)
    if limit is None:
        return None
    properties = _own(move.properties, user)
    body_size = len(move.body)
    if frames.fits(properties, body_size, limit):
        return None
    size = frames.header_size(properties, body_size)
    return TooLarge(position, properties.message_id, size, limit)


async def publish(
    channel: UnderlayChannel,
    move: Move,
    user: str | None,
) -> None:
    """Publish ``move`` with ``mandatory`` and wait for the confirm.

    Raises:
        TooLargeError: its headers do not fit in a frame; nothing was sent.
        OperationError: the broker returned the message (no queue to take it) or
            refused it (a nack: a queue at its length limit), or the channel broke.
    """
    where = f"queue {move.routing_key!r}" if not move.exchange else f"exchange {move.exchange!r}"
    properties = _own(move.properties, user)
    limit = frames.frame_limit(channel)
    if limit is not None and not frames.fits(properties, len(move.body), limit):
        size = frames.header_size(properties, len(move.body))
        raise TooLargeError(where, TooLarge(0, properties.message_id, size, limit))
    try:
        result = await channel.basic_publish(
            move.body,
            exchange=move.exchange,
            routing_key=move.routing_key,
            properties=properties,
            mandatory=True,
        )
    except DeliveryError as exc:
        raise OperationError(f"{where} refused the message (is it full?): {exc!r}") from exc
    except ChannelNotFoundEntity as exc:
        raise OperationError(f"{where} does not exist") from exc
    except (AMQPError, ConnectionError, ChannelInvalidStateError) as exc:
        raise OperationError(f"publishing to {where} failed: {exc!r}") from exc
    if not isinstance(result, commands.Basic.Ack):
        reply = getattr(getattr(result, "delivery", None), "reply_text", type(result).__name__)
        raise OperationError(f"{where} did not take the message ({reply}): does it exist?")


WINDOW = 200
"""Copies in flight at once: the broker's confirms, not the round trips, set the pace."""
_STOP = asyncio.Event()


class PassStoppedError(OperationError):
    """A pass stopped at ``stop_all()``: everything it did is settled, the rest untouched."""


def stop_all() -> None:
    """Make every pass in this process stop after the message it is at, for good.

    For a process that is ending (a signal handler): passes that start later stop at
    once too.

    A pass stops cleanly: the copies in flight are confirmed and their originals
    acked, held messages go back, then it raises ``PassStoppedError``. Cancelling the task
    instead could land between a confirm and its ack, and leave a message twice.
    """
    _STOP.set()


@dataclass(frozen=True, slots=True)
class _InFlight:
    """A copy published and not yet confirmed, and the delivery it replaces."""

    confirm: asyncio.Future[None]
    tag: int
    seen: Seen
    moving: bool


class _Source:
    """The messages of one pass, head first, never one more than were there at its start.

    One ``basic.get`` at a time: a round trip per message (a few milliseconds on a
    quorum queue), while the copies pipeline. A consumer with a prefetch window was
    tried and left: cancelling it on a quorum queue handed back messages whose copies
    were already out, and left them twice (a tryout saw up to 167 of 3,000 with
    dead letters arriving during the pass).
    """

    def __init__(self, underlay: UnderlayChannel, queue: str, total: int) -> None:
        self.underlay = underlay
        self.queue = queue
        self.total = total
        self.received = 0

    async def next(self) -> DeliveredMessage | None:
        """Return the next message, or ``None`` when the pass has seen them all."""
        if self.received >= self.total:
            return None
        got = await self.underlay.basic_get(self.queue, no_ack=False)
        if not isinstance(got.delivery, commands.Basic.GetOk):
            return None  # someone else consumed the rest
        self.received += 1
        return got


def _retrieved(future: asyncio.Future[None]) -> None:
    """Take a finished future's outcome, so asyncio does not report it as never retrieved."""
    if not future.cancelled():
        future.exception()


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
        self.pace = Rate(rate)
        # A paced pass is slow on purpose: one copy in flight costs it no speed, and a
        # kill then leaves at most one message twice, however slow the broker's confirms.
        self.window = 1 if rate else WINDOW
        self.held = 0
        """The highest delivery tag kept unacked (classic queues); 0 for none."""
        self.stuck: list[int] = []
        """Deliveries held because no publish can carry them (a pass that republishes)."""
        self.failure: OperationError | None = None
        """The move that failed; the rest of the pass keeps every message."""
        self.in_flight: deque[_InFlight] = deque()
        self.source = _Source(underlay, done.queue, done.total)

    async def next(self) -> bool:
        """Fetch and handle the next message; return whether the pass goes on."""
        done = self.done
        got = await self.source.next()
        if got is None:
            return False
        tag = got.delivery_tag or 0  # always set on a delivery
        done.visited += 1
        seen = Seen(done.visited, got.body, got.header.properties)
        step: Step = KEEP if self.failure or self.enough() else await self.visit(seen)
        if isinstance(step, Move):
            await self.pace.wait()
            await self.send(step, tag, seen, moving=True)
        elif step is DROP:
            await self.underlay.basic_ack(tag)
            done.dropped += 1
        elif not done.in_place:
            await self.send(
                Move("", done.queue, seen.body, seen.properties), tag, seen, moving=False
            )
        else:
            # Held in place, it needs no publish; one that could not be republished
            # (replayed, imported) is named all the same.
            too_large = oversize(
                self.underlay,
                Move("", done.queue, seen.body, seen.properties),
                self.user,
                seen.position,
            )
            if too_large is not None:
                done.too_large.append(too_large)
            self.hold(tag)
        # A pass that republishes what it keeps goes through every message, so the
        # kept ones end in their old order; one that holds them can end early.
        return not done.in_place or not (self.failure or self.enough())

    def hold(self, tag: int) -> None:
        """Keep a message unacked in its place until the pass ends (classic queues)."""
        self.held = max(self.held, tag)
        self.done.kept += 1

    async def send(self, move: Move, tag: int, seen: Seen, *, moving: bool) -> None:
        """Publish a copy; its delivery is acked once the broker confirms it.

        A copy no frame can carry is not published: the message is held, and given
        back with a requeue when the pass ends.
        """
        too_large = oversize(self.underlay, move, self.user, seen.position)
        if too_large is not None:
            self.done.too_large.append(too_large)
            if self.done.in_place:
                self.hold(tag)
            else:
                self.stuck.append(tag)
                self.done.kept += 1
            return
        confirm = asyncio.ensure_future(publish(self.underlay, move, self.user))
        self.in_flight.append(_InFlight(confirm, tag, seen, moving))
        # Ack what is confirmed at once: a kill now duplicates only what is in flight.
        while self.in_flight and (
            self.in_flight[0].confirm.done() or len(self.in_flight) >= self.window
        ):
            await self.settle()

    async def settle(self) -> None:
        """Wait for the oldest copy in flight; ack its delivery, or keep it if refused."""
        flight = self.in_flight.popleft()
        try:
            await flight.confirm
        except OperationError as exc:
            if not flight.moving:
                # A kept message's copy was refused: the delivery stays unacked and
                # goes back when the channel closes (on a quorum queue, counted).
                self.failure = self.failure or exc
                return
            self.failure = self.failure or exc
            await self.keep(flight)
            return
        await self.underlay.basic_ack(flight.tag)
        if flight.moving:
            self.done.moved += 1
        else:
            self.done.kept += 1

    async def keep(self, flight: _InFlight) -> None:
        """Keep a message whose move failed: in its place, or at the tail."""
        self.done.kept += 1
        if self.done.in_place:
            # A single requeue puts it back in its place, uncounted.
            await self.underlay.basic_nack(flight.tag, multiple=False, requeue=True)
            return
        seen = flight.seen
        with contextlib.suppress(OperationError):
            # If even this fails, the channel closes with it unacked: a counted requeue.
            await publish(
                self.underlay, Move("", self.done.queue, seen.body, seen.properties), self.user
            )
            await self.underlay.basic_ack(flight.tag)

    async def finish(self) -> None:
        """Settle every copy in flight, then put held messages back."""
        try:
            while self.in_flight:
                await self.settle()
        except BaseException:
            # The channel is gone: what is left in flight fails with it, quietly.
            for flight in self.in_flight:
                flight.confirm.add_done_callback(_retrieved)
            raise
        finally:
            if self.held and not self.underlay.is_closed:
                # Uncounted, in their old places (only classic queues hold).
                await self.underlay.basic_nack(self.held, multiple=True, requeue=True)
            for tag in self.stuck:
                if not self.underlay.is_closed:
                    # One by one: the deliveries around them are acked, or in flight no more.
                    await self.underlay.basic_nack(tag, multiple=False, requeue=True)


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

    Once ``enough()`` holds, the rest are kept without a visit (a pass that keeps
    messages in place ends there). ``rate`` spaces the moves out; ``progress`` is called after
    each message.

    Raises:
        OperationError: the queue does not exist; another command is passing
            through it; or a move failed: the message it was moving is kept, and so is
            every one after it.
    """
    check_name(queue)
    async with exclusive(connection, queue):
        return await _walk(connection, queue, visit, enough=enough, rate=rate, progress=progress)


async def _walk(
    connection: AbstractConnection,
    queue: str,
    visit: Callable[[Seen], Awaitable[Step]],
    *,
    enough: Callable[[], bool],
    rate: float | None,
    progress: Callable[[Pass], None] | None,
) -> Pass:
    found = await depth(connection, queue)
    if found is None:
        raise OperationError(f"queue {queue!r} does not exist")
    in_place = await plain_classic(connection, queue)
    done = Pass(queue, found.messages, in_place=in_place, consumers=found.consumers)
    channel = await connection.channel(publisher_confirms=True)
    try:
        underlay = await channel.get_underlay_channel()
        user = getattr(getattr(connection, "url", None), "user", None)
        walker = _Walker(underlay, done, user=user, visit=visit, enough=enough, rate=rate)
        try:
            going = True
            while going and done.visited < done.total and not _STOP.is_set():
                going = await walker.next()
                if progress is not None:
                    progress(done)
        finally:
            await walker.finish()
        if walker.failure is not None:
            raise walker.failure
        if _STOP.is_set() and done.visited < done.total:
            raise PassStoppedError(
                f"interrupted after {done.visited} of {done.total} messages of {queue!r}: "
                "nothing was lost; what the pass went through was acked only after its copy "
                "was confirmed" + ("" if done.in_place else ", and now waits behind the rest")
            )
        return done
    finally:
        if not channel.is_closed:
            await channel.close()
        if in_place and done.kept:
            # Best effort, and never in the way of what the pass raises.
            with contextlib.suppress(Exception):
                await _back_in_place(connection, queue, done.total - done.moved - done.dropped)


_BACK_S = 2.0


async def _back_in_place(connection: AbstractConnection, queue: str, expected: int) -> None:
    """Wait (a little) until the messages a pass held are ready in the queue again.

    A classic queue requeues what a closed channel held after the close is answered:
    a pass right after this one (a second ``dlq list``, the page's next view) would
    count, and see, fewer. Not for ever: a consumer of the queue may take some meanwhile.
    """
    deadline = asyncio.get_running_loop().time() + _BACK_S
    while asyncio.get_running_loop().time() < deadline:
        found = await depth(connection, queue)
        if found is None or found.messages >= expected:
            return
        await asyncio.sleep(0.02)
