"""The skeleton both engine consumers share: their consumers, deliveries in flight, settling.

The re-check consumer (``rabbit.recheck``) and the worker's intake consumer
(``worker.consumer``) each turn one delivery into one step, a copy published with a
confirm (``rabbit.step``). Everything around that step is the same for both and lives
here:

- each delivery is handled in a task of its own, tracked while it is in flight;
- a delivery whose copy was confirmed is acked; any other is requeued after a pause
  (no hot loop), never lost;
- an ``Exception`` (a hostile message) is logged and never kills the consumer;
- a delivery interrupted after its copy was confirmed (a stop, a lost connection, an
  application's own ``BaseException`` from a hook) is acked before the interruption goes
  on, or the broker would deliver it again, a duplicate of the copy;
- a stop takes no new delivery, at once: one that arrives from then on is left unacked,
  for the broker to take back when the channel closes; it gives the deliveries in flight,
  and the acks on their way, time to finish, and cancels the consumers meanwhile, in the
  background (a round trip each: 300 of them made a broker's stop 2 s longer), and
  returns once those cancels are answered: one still waiting when the connection closes
  held the close for its whole timeout on aiormq 6;
- a stop ends with a round trip on each channel that settled a delivery: the broker
  answers it only once it has processed the acks written before it. aiormq 6 (aio-pika
  9, the stack of Python 3.10) closes a connection without waiting for the broker's
  answer, and acks still queued on the broker's side went with it: the broker delivered
  those messages again, second copies of confirmed ones (a release made twice in about
  1 stop in 20 of ``test_stops_in_the_middle_of_retries...`` on a loaded machine).

With ``ack_runs`` the acks of a channel go out in runs (``rabbit.acks.AckRuns``: one
``multiple`` ack for many deliveries); a consumer that uses them must have its channel
to itself, or a run could cover another consumer's delivery still in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import TYPE_CHECKING, Any, TypeAlias

from faststream_retry.rabbit.acks import AckRuns
from faststream_retry.rabbit.channels import RPC_TIMEOUT_S
from faststream_retry.rabbit.publisher import Outcome
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from aio_pika.abc import AbstractIncomingMessage, AbstractQueue, ConsumerTag

__all__ = ["Act", "Consumer", "settle"]

Act: TypeAlias = "Callable[[AbstractIncomingMessage, list[Outcome]], Awaitable[None]]"
"""Publishes a delivery's step, appending each publish's outcome to the list it gets."""


class Consumer:
    """The consumers of one engine consumer, keyed by name, and the deliveries in flight."""

    def __init__(self, *, pause_s: float, ack_runs: bool = False) -> None:
        """Requeue an unconfirmed delivery after ``pause_s``; ``ack_runs``: ack in runs."""
        self._pause_s = pause_s
        self._consumers: dict[str, tuple[AbstractQueue, ConsumerTag]] = {}
        self._pending: set[asyncio.Task[Any]] = set()
        self._stopped = False
        self._cancelling: set[asyncio.Task[None]] = set()
        self._acks: weakref.WeakKeyDictionary[Any, AckRuns] | None = (
            weakref.WeakKeyDictionary() if ack_runs else None
        )
        # The channels deliveries came on: a stop's round trip goes to each.
        self._channels: weakref.WeakSet[Any] = weakref.WeakSet()

    def __contains__(self, key: str) -> bool:
        """Return whether the consumer named ``key`` runs."""
        return key in self._consumers

    def tag(self, key: str) -> ConsumerTag:
        """Return the consumer tag of the consumer named ``key``."""
        return self._consumers[key][1]

    @property
    def tags(self) -> list[ConsumerTag]:
        """Return the tags of every consumer that runs."""
        return [tag for _, tag in self._consumers.values()]

    async def consume(
        self,
        key: str,
        queue: AbstractQueue,
        act: Act,
        *,
        what: str,
    ) -> ConsumerTag:
        """Consume ``queue`` as ``key``: each delivery's step is ``act``'s; return the tag.

        ``what`` names a delivery in the log line of one whose handling raised.
        """

        async def on_message(message: AbstractIncomingMessage) -> None:
            if self._stopped:
                return  # left unacked: the broker takes it back when the channel closes
            task = asyncio.current_task()
            if task is not None:
                self._pending.add(task)
            with contextlib.suppress(Exception):  # closed already: nothing to wait for
                self._channels.add(message.channel)
            try:
                await self._handle(message, act, what)
            finally:
                if task is not None:
                    self._pending.discard(task)

        self._stopped = False
        tag = await queue.consume(on_message, timeout=RPC_TIMEOUT_S)
        self._consumers[key] = (queue, tag)
        return tag

    async def cancel(self, key: str) -> None:
        """Stop the consumer named ``key`` (quietly: its channel may be gone)."""
        consumer = self._consumers.pop(key, None)
        if consumer is not None:
            await _cancel(*consumer)

    def forget(self) -> None:
        """Forget every consumer: their channel closed, and they went with it."""
        self._consumers.clear()

    async def stop(self, wait_s: float) -> None:
        """Take no new delivery and give those in flight up to ``wait_s`` to settle.

        The consumers are cancelled in the background: the caller closes the channel
        next, which ends them too, and hands back every delivery left unacked.
        """
        self._stopped = True
        consumers = list(self._consumers.values())
        self._consumers.clear()
        if consumers:
            task = asyncio.create_task(_cancel_all(consumers, wait_s))
            self._cancelling.add(task)
            task.add_done_callback(self._cancelling.discard)
        if self._pending:
            await asyncio.wait(self._pending, timeout=wait_s)
        # Acks still on their way: a channel closed before them would have the broker
        # deliver those messages again, duplicates of copies already confirmed.
        for runs in list(self._acks.values()) if self._acks is not None else ():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runs.drain(), wait_s)
        # No cancel may still wait for its answer when the caller closes the connection:
        # aiormq 6 (aio-pika 9, Python 3.10) cancels it then, and Python 3.10's wait_for
        # can swallow that cancellation; the cancel then waited out its whole timeout,
        # and broker.stop() with it (30 s, the README quickstart's stop in CI).
        if self._cancelling:
            await asyncio.wait(self._cancelling, timeout=wait_s)
        for channel in list(self._channels):
            await _processed(channel, wait_s)

    async def _handle(
        self,
        message: AbstractIncomingMessage,
        act: Act,
        what: str,
    ) -> None:
        """Publish the delivery's step, then settle it as the copy says."""
        outcomes: list[Outcome] = []
        try:
            await act(message, outcomes)
        except Exception:  # a hostile message must never kill the consumer
            log.exception("%s failed", what)
        except BaseException:
            # KeyboardInterrupt, SystemExit, a cancellation (a stop, a lost connection) or
            # an application's own BaseException from a hook or a log handler, after the
            # copy was confirmed: it goes on, but this delivery is settled first as the
            # copy says, or the broker would deliver it again later, a duplicate of it.
            await settle(message, ok=Outcome.CONFIRMED in outcomes, pause_s=0)
            runs = self._runs(message)
            if runs is not None:
                runs.settled(message)
            raise
        await self._settle(message, ok=Outcome.CONFIRMED in outcomes)

    async def _settle(self, message: AbstractIncomingMessage, *, ok: bool) -> None:
        if self._acks is None:
            await settle(message, ok=ok, pause_s=0 if ok else self._pause_s)
            return
        runs = self._runs(message)
        if runs is None:
            return  # its channel closed: the broker delivers it again, nothing to ack
        if ok:
            # Acked with the other deliveries confirmed in this turn, in one frame.
            runs.ack(message)
            return
        await settle(message, ok=False, pause_s=self._pause_s)
        runs.settled(message)

    def _runs(self, message: AbstractIncomingMessage) -> AckRuns | None:
        """Return the ack runs of the channel ``message`` came on; ``None`` once it closed.

        ``None`` too without ``ack_runs``. aio-pika raises on reading a closed channel: a
        broker restart closes it under every delivery in flight, and each would end its
        task in a traceback.
        """
        if self._acks is None:
            return None
        try:
            channel = message.channel
        except Exception:  # ChannelInvalidStateError, whatever the aio-pika version
            return None
        runs = self._acks.get(channel)
        if runs is None:
            runs = self._acks[channel] = AckRuns(channel)
        return runs


async def _cancel_all(consumers: list[tuple[AbstractQueue, ConsumerTag]], wait_s: float) -> None:
    for consumer in consumers:
        # A channel left half-open by a broker crash may never answer the cancel: the
        # stop's own bound holds for it too, not the RPC timeout on top of it.
        await _cancel(*consumer, timeout=min(wait_s, RPC_TIMEOUT_S))


async def _processed(channel: Any, wait_s: float) -> None:  # noqa: ANN401 - aiormq's channel
    """Return once the broker has processed what was written on ``channel`` before this.

    A passive declare of ``amq.direct``, which every broker has and no permission guards:
    its answer comes after the acks written before it (a channel's frames are handled in
    order), and it changes nothing.
    """
    if getattr(channel, "is_closed", True):
        return
    with contextlib.suppress(Exception):  # gone meanwhile: the broker has them back
        await asyncio.wait_for(channel.exchange_declare("amq.direct", passive=True), wait_s)


async def _cancel(
    queue: AbstractQueue, tag: ConsumerTag, *, timeout: float = RPC_TIMEOUT_S
) -> None:
    with contextlib.suppress(Exception):  # its channel may be gone, and the consumer with it
        await queue.cancel(tag, timeout=timeout)


async def settle(message: AbstractIncomingMessage, *, ok: bool, pause_s: float) -> None:
    """Ack after a confirmed publish; otherwise requeue, after a pause (no hot loop)."""
    try:
        if ok:
            await message.ack()
            return
        if pause_s:
            await asyncio.sleep(pause_s)  # pause before the requeue: no hot loop
        await message.nack(requeue=True)
    except Exception as exc:  # channel gone: the broker redelivers the unacked copy
        # A broker restart closes the channel under every delivery in flight: one line
        # each at WARNING would flood the log with what the reconnect line says.
        log.debug("could not settle message %s: %r", message.message_id, exc)
