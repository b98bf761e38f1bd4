"""The re-check consumer's acks, sent in runs: one ``multiple`` ack for many deliveries.

The broker confirms copies in batches, so many deliveries become ready to ack in the same
turn of the event loop. ``AckRuns`` then sends one ack with ``multiple`` for the longest
run of consecutive delivery tags that are all settled or ready, and single acks for the
ready ones beyond a gap. A delivery is acked only once it is ready (its copy confirmed),
and a delivery still in flight, or one that has not reached the consumer yet, ends the
run: a ``multiple`` ack never covers a delivery that is not ready.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage

__all__ = ["AckRuns"]


class AckRuns:
    """Acks the deliveries of one channel (delivery tags 1, 2, 3, ... in order)."""

    def __init__(self, channel: object) -> None:
        """Ack deliveries of ``channel``; its delivery tags start at 1."""
        self.channel = channel
        self._floor = 0  # every delivery tag up to here is settled
        self._ready: dict[int, AbstractIncomingMessage] = {}
        self._gone: set[int] = set()  # settled above the floor: acked alone, or nacked
        self._flushing = False
        self._sending: set[asyncio.Task[Any]] = set()
        # One flush's acks go out before the next flush's: a later multiple ack
        # written first would cover a tag acked alone after it (a double ack closes
        # the channel). asyncio.Lock wakes its waiters in order.
        self._order = asyncio.Lock()

    def ack(self, message: AbstractIncomingMessage) -> None:
        """Ack ``message`` in the next run (in this turn of the event loop)."""
        tag = message.delivery_tag
        if tag is not None and tag > self._floor:
            self._ready[tag] = message
            self._schedule()

    def settled(self, message: AbstractIncomingMessage) -> None:
        """Say that ``message`` was settled otherwise (nacked): runs may pass over it."""
        tag = message.delivery_tag
        if tag is not None and tag > self._floor:
            self._gone.add(tag)
            self._schedule()

    def _schedule(self) -> None:
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def drain(self) -> None:
        """Wait for the acks on their way to the channel."""
        if self._flushing:
            self._flush()  # now, not on the next turn; the scheduled call finds nothing
        while self._sending:
            await asyncio.wait(set(self._sending))

    def _advance(self) -> AbstractIncomingMessage | None:
        """Move the floor over settled and ready tags; return the last ready one passed."""
        last = None
        floor, ready, gone = self._floor, self._ready, self._gone
        while True:
            nxt = floor + 1
            if nxt in ready:
                last = ready.pop(nxt)
            elif nxt in gone:
                gone.discard(nxt)
            else:
                break
            floor = nxt
        self._floor = floor
        return last

    def _flush(self) -> None:
        self._flushing = False
        sends: list[tuple[AbstractIncomingMessage, bool]] = []
        last = self._advance()
        if last is not None:
            sends.append((last, True))
        for tag, message in self._ready.items():  # beyond a gap: acked alone
            self._gone.add(tag)
            sends.append((message, False))
        self._ready.clear()
        if sends:
            task = asyncio.ensure_future(self._send(sends))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, sends: list[tuple[AbstractIncomingMessage, bool]]) -> None:
        async with self._order:
            message = None
            try:
                for message, multiple in sends:
                    await message.ack(multiple=multiple)
            except Exception as exc:  # channel gone: the broker redelivers the unacked
                log.warning(
                    "could not ack message %s (and %d more): %r",
                    getattr(message, "message_id", None),
                    len(sends) - 1,
                    exc,
                )
