"""The confirming publisher: copies of messages, confirmed by the broker or not at all.

It publishes on a channel of the plugin's own, so FastStream's broker-level middlewares
never see the plugin's copies and nothing rewrites ``app_id`` or invents ids.

A copy whose destination is missing (an operator deleted a ``.dlq``, a ``.retry`` or a
tier while the app runs) comes back returned ``312 NO_ROUTE``, or, for a missing
exchange, closes the channel with ``404 NOT_FOUND``. The publisher then asks its
``repair`` callback to declare the destination again, and publishes once more. Repairs
are rate-limited, so a broker that keeps refusing never turns it into a hot loop; a
copy that still fails takes the usual path (not confirmed: the original is requeued
after a pause).

A copy is measured against the connection's frame limit before it goes (see
``faststream_retry.core.fit``): one that would not fit is sent lean, or, if even that does
not fit, not at all (``TOO_LARGE``), so no copy of the plugin's ever closes the
connection it shares with the application.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from aiormq.exceptions import AMQPError, ChannelNotFoundEntity, DeliveryError
from pamqp import commands
from pamqp.encode import field_table as encode_table

from faststream_retry.core import fit
from faststream_retry.rabbit import frames
from faststream_retry.rabbit.deadlines import Deadlines
from faststream_retry.reporting.log import Throttle, log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from aio_pika.abc import AbstractIncomingMessage
    from aiormq.abc import AbstractChannel as UnderlayChannel

    from faststream_retry.core.steps import Copy

__all__ = [
    "QUIET_INTERVAL_S",
    "REPAIR_INTERVAL_S",
    "Outcome",
    "Publisher",
    "copy_properties",
    "encodable_headers",
]

REPAIR_INTERVAL_S = 5.0
"""At most one redeclaration per this many seconds, whatever fails how often."""

NO_ROUTE = 312
"""The reply code of a mandatory publish that reached no queue."""

QUIET_INTERVAL_S = 10.0
"""A destination that keeps refusing copies gets one line per outcome this often."""


class Outcome(enum.Enum):
    """What became of a publish."""

    CONFIRMED = "confirmed"
    """``Basic.Ack`` for a routed message."""
    REFUSED = "refused"
    """``Basic.Nack``: the queue would not take it (at its length limit, no leader)."""
    FAILED = "failed"
    """Returned (unroutable), no confirm in time, or the channel or connection gone."""
    TOO_LARGE = "too large"
    """Not sent: even without the story headers it would not fit in a frame."""


class Publisher:
    """Publishes with ``mandatory`` and a broker confirm; a return or a nack is a failure."""

    def __init__(
        self,
        channel: Callable[[], Awaitable[UnderlayChannel]],
        timeout_s: float,
        *,
        repair: Callable[[str, str], Awaitable[bool]] | None = None,
        repair_interval_s: float = REPAIR_INTERVAL_S,
    ) -> None:
        """Publish on the channel ``channel()`` returns (opened with publisher confirms).

        ``repair(exchange, routing_key)`` is awaited when a publish finds its
        destination missing: it declares it again if it is the plugin's own and
        returns whether it did. At most one repair runs at a time, and at most one
        per ``repair_interval_s``.
        """
        self._channel = channel
        self._timeout_s = timeout_s
        self._repair = repair
        self._repair_interval_s = repair_interval_s
        self._repair_lock = asyncio.Lock()
        self._repaired_at: float | None = None
        self._quiet = Throttle(QUIET_INTERVAL_S)
        self._deadlines = Deadlines(timeout_s)
        self.repairs = 0
        """How many times ``repair`` declared a missing destination again."""
        # aiormq matches a basic.return to its publish by message_id; two publishes
        # of one id in flight at once (a fanout message failing in two queues)
        # could swap their outcomes, so they go one after the other.
        # A future is made only when a second publish of an id arrives (rare).
        self._inflight: dict[str, asyncio.Future[None] | None] = {}

    async def send(self, message: AbstractIncomingMessage, copy: Copy) -> bool:
        """Publish ``copy`` of ``message``; ``True`` only once confirmed.

        Never raises: whatever goes wrong means "not confirmed", and the caller keeps
        the original.
        """
        return await self.deliver(message, copy) is Outcome.CONFIRMED

    async def deliver(self, message: AbstractIncomingMessage, copy: Copy) -> Outcome:
        """Publish ``copy`` of ``message`` and say how it went; never raises."""
        try:
            return await self.publish(
                exchange=copy.exchange,
                routing_key=copy.routing_key,
                body=message.body,
                properties=copy_properties(message, copy.headers),
                room=copy.room,
            )
        except Exception:  # never let a publish problem lose the original
            log.exception("could not publish a copy of message %s", message.message_id)
            return Outcome.FAILED

    async def publish(
        self,
        *,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: commands.Basic.Properties,
        room: bool = False,
    ) -> Outcome:
        """Publish; ``CONFIRMED`` only on a ``Basic.Ack`` for a routed message.

        Properties that would not fit in a frame are made lean first; ``room`` lets the
        message's own largest headers go too (a dead letter: see ``fit.make_room``).
        """
        message_id = properties.message_id or ""
        while message_id in self._inflight:
            waiter = self._inflight[message_id]
            if waiter is None:
                waiter = self._inflight[message_id] = asyncio.get_running_loop().create_future()
            await asyncio.shield(waiter)
        self._inflight[message_id] = None
        try:
            repairs = self.repairs
            outcome, missing = await self._publish(exchange, routing_key, body, properties, room)
            if missing and await self._repaired(exchange, routing_key, repairs):
                outcome, _ = await self._publish(exchange, routing_key, body, properties, room)
            return outcome
        finally:
            waiter = self._inflight.pop(message_id)
            if waiter is not None:
                waiter.set_result(None)

    async def _publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: commands.Basic.Properties,
        room: bool,
    ) -> tuple[Outcome, bool]:
        """Publish once; return the outcome and whether the destination was missing."""
        try:
            channel = await self._channel()
            if not _fitted(channel, exchange, routing_key, body, properties, room=room):
                return Outcome.TOO_LARGE, False
            # wait=False: the channel's lock is let go as soon as the frames are
            # queued, so copies in flight pipeline instead of each waiting for the
            # socket; the confirm is what this waits for, bounded by the watchdog.
            result = await self._deadlines.run(
                channel.basic_publish(  # type: ignore[call-arg] # aiormq's ABC omits wait=
                    body,
                    exchange=exchange,
                    routing_key=routing_key,
                    properties=properties,
                    mandatory=True,
                    wait=False,
                ),
            )
        except (AMQPError, ConnectionError, asyncio.TimeoutError) as exc:
            self._quiet.log(
                logging.WARNING,
                (exchange, routing_key, "not confirmed"),
                "publish of message %s to %r/%r not confirmed: %s",
                properties.message_id,
                exchange,
                routing_key,
                _describe(exc),
            )
            nack = isinstance(exc, DeliveryError) and isinstance(exc.frame, commands.Basic.Nack)
            if nack:
                return Outcome.REFUSED, False
            return Outcome.FAILED, isinstance(exc, ChannelNotFoundEntity)
        except Exception as exc:  # before anything was sent: marshalling the frame failed
            headers = properties.headers or {}
            kept = encodable_headers(headers)
            if len(kept) == len(headers):
                log.exception("publish to %r/%r failed", exchange, routing_key)
                return Outcome.FAILED, False
            # The encoder refused a header value (each pamqp version refuses other
            # values, some of them ones it decoded itself, and raises other errors):
            # send the headers that encode, or the message would cycle for ever.
            log.warning(
                "dropping unencodable headers %s from message %s (%r)",
                sorted(set(headers) - set(kept)),
                properties.message_id,
                exc,
            )
            properties.headers = kept
            return await self._publish(exchange, routing_key, body, properties, room)
        outcome = _outcome_of(result, properties.message_id, exchange, routing_key, self._quiet)
        frame = getattr(result, "delivery", None)
        return outcome, getattr(frame, "reply_code", None) == NO_ROUTE

    async def _repaired(self, exchange: str, routing_key: str, seen: int) -> bool:
        """Whether to publish again: the destination was (or has just been) declared again.

        ``seen`` is ``repairs`` when the publish went out: a repair that completed
        since then covers this publish too (a burst of copies to one deleted queue
        makes one redeclaration, and each copy is published again once).
        """
        if self._repair is None:
            return False
        async with self._repair_lock:
            if self.repairs != seen:
                return True
            now = time.monotonic()
            if self._repaired_at is not None and now - self._repaired_at < self._repair_interval_s:
                return False
            self._repaired_at = now
            try:
                done = await self._repair(exchange, routing_key)
            except Exception:  # a failed repair is a failed publish, nothing more
                log.exception("declaring %r/%r again failed", exchange, routing_key)
                return False
            if done:
                self.repairs += 1
            return done


def _fitted(
    channel: UnderlayChannel,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: commands.Basic.Properties,
    *,
    room: bool,
) -> bool:
    """Make ``properties`` fit in a frame of ``channel``'s connection; ``False``: they cannot.

    Raises what the encoder raises for a header it cannot encode: the caller leaves such
    headers out and measures again.
    """
    limit = frames.frame_limit(channel)
    if limit is None or frames.fits(properties, len(body), limit):
        return True
    headers = dict(properties.headers or {})
    weigh = frames.weigher(properties, len(body))
    size = weigh(headers)
    lean = fit.lean(headers)
    if weigh(lean) <= limit:
        log.warning(
            "message %s: its copy to %r/%r would take %d bytes of a frame that holds %d: "
            "sent without %s",
            properties.message_id,
            exchange,
            routing_key,
            size,
            limit,
            ", ".join(sorted(set(headers) & set(fit.TOLD))) or "retry-error's tail",
        )
        return True
    made = fit.make_room(lean, weigh, limit) if room else None
    if made is None:
        properties.headers = headers
        log.warning(
            "message %s: its copy to %r/%r would take %d bytes of a frame that holds %d, "
            "and its own headers leave no room: not published",
            properties.message_id,
            exchange,
            routing_key,
            size,
            limit,
        )
        return False
    properties.headers, dropped = made
    log.warning(
        "message %s: its own headers leave no room in a frame of %d bytes: its copy to "
        "%r/%r leaves out %s",
        properties.message_id,
        limit,
        exchange,
        routing_key,
        ", ".join(f"{key!r} ({taken:,} bytes)" for key, taken in dropped),
    )
    return True


def _describe(exc: BaseException) -> str:
    """Name what went wrong without the message: a DeliveryError's repr carries the body."""
    if isinstance(exc, DeliveryError):
        return f"{type(exc).__name__} ({type(exc.frame).__name__})"
    return repr(exc)


def _outcome_of(
    result: object, message_id: str | None, exchange: str, routing_key: str, quiet: Throttle
) -> Outcome:
    """Read the broker's answer to a publish that went out."""
    if isinstance(result, commands.Basic.Ack):
        return Outcome.CONFIRMED
    if isinstance(result, commands.Basic.Nack):
        quiet.log(
            logging.WARNING,
            (exchange, routing_key, "refused"),
            "publish of message %s to %r/%r refused by the broker (nack)",
            message_id,
            exchange,
            routing_key,
        )
        return Outcome.REFUSED
    # A returned message's repr carries its body: log the broker's reason only.
    frame = getattr(result, "delivery", None)
    quiet.log(
        logging.ERROR,
        (exchange, routing_key, "returned"),
        "publish of message %s to %r/%r was returned by the broker: %s %s",
        message_id,
        exchange,
        routing_key,
        getattr(frame, "reply_code", "?"),
        getattr(frame, "reply_text", type(result).__name__),
    )
    return Outcome.FAILED


def encodable_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Return the headers whose values the installed AMQP encoder accepts."""
    kept = {}
    for key, value in headers.items():
        try:
            encode_table({key: value})
        except Exception:  # noqa: S112 - any encoder failure means: leave it out
            continue
        kept[key] = value
    return kept


def copy_properties(
    src: AbstractIncomingMessage, headers: dict[str, Any]
) -> commands.Basic.Properties:
    """Return the properties of a republished copy of ``src``.

    Everything the application set travels unchanged, except ``expiration`` (the
    copy would expire inside a tier) and ``user_id`` (RabbitMQ refuses a publish
    whose user_id is not the connection's user). Copies are persistent. A message
    without an id gets one, kept from then on.
    """
    return commands.Basic.Properties(
        content_type=src.content_type,
        content_encoding=src.content_encoding,
        headers=headers,
        delivery_mode=2,
        priority=src.priority,
        correlation_id=src.correlation_id,
        reply_to=src.reply_to,
        message_id=src.message_id or uuid.uuid4().hex,
        timestamp=src.timestamp,
        message_type=src.type,
        app_id=src.app_id,
    )
